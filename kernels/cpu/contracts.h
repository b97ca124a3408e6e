// Input contracts of the ssmcc CPU kernels, stated once. Every binding derives the sizes below
// from its tensors and calls the matching check before a kernel runs: the torch entry points
// (torch_entry.cpp: the sizes ctypes passes) and the ONNX Runtime kernels (ort_ops.cpp: the
// sizes read from each input's shape, every input checked against them). A check returns an
// empty string when the sizes are consistent, else a message naming the argument; the kernels of
// ssm_kernels.h index only within buffers of these sizes.
//
//   selective_scan          u, delta, z (b, d, l); A (d, n); B (b, gb, n, l); C (b, gc, n, l);
//                           D, delta_bias (d); h0 (b, d, n);   gb and gc each divide d
//   selective_state_update  state (b, d, n); x, dt, z (b, d); A (d, n); B (b, gb, n);
//                           C (b, gc, n); D, dt_bias (d);      gb and gc each divide d
//   causal_conv1d           x (b, d, l); weight (d, k); bias (d); state (b, d, k-1);   k >= 1
//   causal_conv1d_update    x (b, d); state (b, d, k-1); weight (d, k); bias (d);       k >= 1
//   ssd_scan                x, z, out (b, l, h, p); dt (b, l, h); A, dt_bias (h); D (h, p);
//                           B, C (b, l, g, n); h0, final state (b, h, p, n);     g divides h
//   ssd_state_update        state (b, h, p, n); x, z (b, h, p); dt (b, h); A, dt_bias (h);
//                           D (h, p); B, C (b, g, n);                            g divides h
//   rmsnorm_gated           x, z, out (rows, d); weight (d);        group_size >= 1 divides d
//   ssd_mixer               proj (b, l, w); conv weight (c, k), c = h p + 2 g n; A, dt_bias (h);
//                           D (h, p); norm weight (h p); conv state (b, c, k-1); ssm state
//                           (b, h, p, n); z/xBC/dt spans within w; g divides h; the norm's
//                           group size divides h p (a step: proj (b, w), length 1)
//   mamba_mixer             proj (b, l, w); conv weight (d, k); x_proj (R + 2n, d); dt_proj (d, R);
//                           A (d, n); D, dt_bias, conv bias (d); conv state (b, d, k-1); ssm
//                           state (b, d, n); x and z spans within w (a step: proj (b, w))
// The ssd ops may read x, dt, B, C, z with a token stride (elements from one position to the
// next, inner dims packed): 0 (packed) or at least the packed width (check_ssd_strides).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

namespace ssmcc {

inline std::string check_nonnegative(const char* op, const char* what, int64_t value) {
  if (value >= 0) return "";
  return std::string(op) + ": " + what + " is " + std::to_string(value) + ", expected >= 0";
}

inline std::string check_groups(const char* op, const char* name, int64_t groups, int64_t dim) {
  if (groups >= 1 && dim % groups == 0) return "";
  return std::string(op) + ": " + name + " has " + std::to_string(groups) +
         " groups, which does not divide dim=" + std::to_string(dim);
}

inline std::string first_error(std::initializer_list<std::string> errors) {
  for (const auto& error : errors)
    if (!error.empty()) return error;
  return "";
}

inline std::string check_scan(const char* op, int64_t batch, int64_t dim, int64_t length,
                              int64_t groups_b, int64_t groups_c, int64_t dstate) {
  return first_error({check_nonnegative(op, "batch", batch), check_nonnegative(op, "dim", dim),
                      check_nonnegative(op, "length", length),
                      check_nonnegative(op, "state size", dstate),
                      check_groups(op, "B", groups_b, dim), check_groups(op, "C", groups_c, dim)});
}

inline std::string check_conv(const char* op, int64_t batch, int64_t dim, int64_t length,
                              int64_t width) {
  std::string error = first_error({check_nonnegative(op, "batch", batch),
                                   check_nonnegative(op, "dim", dim),
                                   check_nonnegative(op, "length", length)});
  if (error.empty() && width < 1)
    error = std::string(op) + ": kernel width is " + std::to_string(width) + ", expected >= 1";
  return error;
}

inline std::string check_ssd(const char* op, int64_t batch, int64_t length, int64_t heads,
                             int64_t head_dim, int64_t groups, int64_t dstate) {
  std::string error = first_error(
      {check_nonnegative(op, "batch", batch), check_nonnegative(op, "length", length),
       check_nonnegative(op, "heads", heads), check_nonnegative(op, "head_dim", head_dim),
       check_nonnegative(op, "state size", dstate)});
  if (error.empty() && (groups < 1 || heads % groups != 0))
    error = std::string(op) + ": B and C have " + std::to_string(groups) +
            " groups, which does not divide heads=" + std::to_string(heads);
  return error;
}

inline std::string check_stride(const char* op, const char* name, int64_t stride, int64_t width) {
  if (stride == 0 || stride >= width) return "";
  return std::string(op) + ": " + name + " has token stride " + std::to_string(stride) +
         ", less than its row of " + std::to_string(width) + " elements";
}

inline std::string check_ssd_strides(const char* op, int64_t heads, int64_t head_dim,
                                     int64_t groups, int64_t dstate, int64_t x_stride,
                                     int64_t dt_stride, int64_t b_stride, int64_t c_stride,
                                     int64_t z_stride) {
  const int64_t hp = heads * head_dim, gn = groups * dstate;
  return first_error({check_stride(op, "x", x_stride, hp), check_stride(op, "dt", dt_stride, heads),
                      check_stride(op, "B", b_stride, gn), check_stride(op, "C", c_stride, gn),
                      check_stride(op, "z", z_stride, hp)});
}

inline std::string check_span(const char* op, const char* name, int64_t offset, int64_t size,
                              int64_t width) {
  if (offset >= 0 && offset + size <= width) return "";
  return std::string(op) + ": " + name + " at [" + std::to_string(offset) + ", " +
         std::to_string(offset + size) + ") does not fit the projection width " +
         std::to_string(width);
}

inline std::string check_ssd_mixer(const char* op, int64_t batch, int64_t length, int64_t width,
                                   int64_t heads, int64_t head_dim, int64_t groups,
                                   int64_t dstate, int64_t kernel, int64_t z_offset,
                                   int64_t xbc_offset, int64_t dt_offset,
                                   int64_t norm_group_size) {
  std::string error = check_ssd(op, batch, length, heads, head_dim, groups, dstate);
  const int64_t inner = heads * head_dim, channels = inner + 2 * groups * dstate;
  if (error.empty() && kernel < 1)
    error = std::string(op) + ": kernel width is " + std::to_string(kernel) + ", expected >= 1";
  if (error.empty() && (norm_group_size < 1 || inner % norm_group_size != 0))
    error = std::string(op) + ": norm group size " + std::to_string(norm_group_size) +
            " does not divide " + std::to_string(inner);
  return first_error({error, check_span(op, "xBC", xbc_offset, channels, width),
                      check_span(op, "dt", dt_offset, heads, width),
                      z_offset < 0 ? "" : check_span(op, "z", z_offset, inner, width)});
}

inline std::string check_mamba_mixer(const char* op, int64_t batch, int64_t length, int64_t width,
                                     int64_t x_offset, int64_t z_offset, int64_t channels,
                                     int64_t kernel, int64_t rank, int64_t dstate) {
  std::string error = first_error(
      {check_nonnegative(op, "batch", batch), check_nonnegative(op, "length", length),
       check_nonnegative(op, "channels", channels), check_nonnegative(op, "dt rank", rank),
       check_nonnegative(op, "state size", dstate)});
  if (error.empty() && kernel < 1)
    error = std::string(op) + ": kernel width is " + std::to_string(kernel) + ", expected >= 1";
  return first_error({error, check_span(op, "x", x_offset, channels, width),
                      z_offset < 0 ? "" : check_span(op, "z", z_offset, channels, width)});
}

inline std::string check_norm(const char* op, int64_t rows, int64_t dim, int64_t group_size) {
  std::string error =
      first_error({check_nonnegative(op, "rows", rows), check_nonnegative(op, "d", dim)});
  if (error.empty() && (group_size < 1 || dim % group_size != 0))
    error = std::string(op) + ": group_size " + std::to_string(group_size) +
            " does not divide d=" + std::to_string(dim);
  return error;
}

}  // namespace ssmcc
