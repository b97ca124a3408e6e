// C entry points of the ssmcc kernels for the torch target (called through ctypes with tensor
// data pointers; see kernels/cpu/torch_binding.py). Rows are split over OpenMP threads.
// Each entry checks its sizes against the input contract (contracts.h) and returns 0, or 1 with
// the reason in ssmcc_last_error(); an exception (e.g. an allocation failure) never crosses the
// C boundary.
#include <omp.h>

#include <exception>
#include <string>

#include "contracts.h"
#include "denormals.h"
#include "gemv.h"
#include "gemv_quantized.h"
#include "mamba_mixer.h"
#include "moe_experts.h"
#include "ssd_chunked.h"
#include "ssd_kernels.h"
#include "ssd_mixer.h"
#include "ssm_kernels.h"
#include "torch_entry.h"

namespace {
using ssmcc::tuning::kParallelWork;

thread_local std::string last_error;

template <typename Fn>
void parallel_rows(int64_t rows, int64_t work_per_row, int threads, Fn fn) {
  if (threads <= 1 || rows < 2 || rows * work_per_row < kParallelWork) {
    fn(0, rows);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const ssmcc::FlushDenormals flush;  // per worker thread
    const int64_t count = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t begin = rows * id / count, end = rows * (id + 1) / count;
    fn(begin, end);
  }
}

// Runs ``body`` when ``contract`` holds; 0 on success, 1 with ``last_error`` set otherwise.
template <typename Body>
int guarded(const std::string& contract, Body body) {
  if (!contract.empty()) {
    last_error = contract;
    return 1;
  }
  try {
    const ssmcc::FlushDenormals flush;  // the calling thread, for this call
    body();
  } catch (const std::exception& error) {
    last_error = error.what();
    return 1;
  }
  return 0;
}
}  // namespace

SSMCC_EXPORT const char* ssmcc_last_error() { return last_error.c_str(); }

SSMCC_EXPORT int ssmcc_selective_scan_f32(const float* u, const float* delta, const float* A,
                                          const float* B, const float* C, const float* D,
                                          const float* z, const float* delta_bias,
                                          const float* h0, float* out, float* last, int64_t batch,
                                          int64_t dim, int64_t length, int64_t groups_b,
                                          int64_t groups_c, int64_t dstate, int32_t softplus,
                                          int32_t threads) {
  const auto contract =
      ssmcc::check_scan("selective_scan", batch, dim, length, groups_b, groups_c, dstate);
  return guarded(contract, [&] {
    std::vector<float> Bt(batch * groups_b * dstate * length);
    std::vector<float> Ct(batch * groups_c * dstate * length);
    ssmcc::transpose_state_length(B, Bt.data(), batch * groups_b, dstate, length);
    ssmcc::transpose_state_length(C, Ct.data(), batch * groups_c, dstate, length);
    ssmcc::ScanArgs args{};
    args.u = u, args.delta = delta, args.A = A, args.D = D, args.z = z;
    args.delta_bias = delta_bias, args.h0 = h0, args.Bt = Bt.data(), args.Ct = Ct.data();
    args.out = out, args.last = last, args.batch = batch, args.dim = dim, args.length = length;
    args.groups_b = groups_b, args.groups_c = groups_c, args.dstate = dstate;
    args.softplus = softplus != 0;
    parallel_rows(batch * dim, length * dstate, threads,
                  [&](int64_t b, int64_t e) { ssmcc::selective_scan_rows(args, b, e); });
  });
}

SSMCC_EXPORT int ssmcc_causal_conv1d_f32(const float* x, const float* weight, const float* bias,
                                         const float* state0, float* out, float* final_state,
                                         int64_t batch, int64_t dim, int64_t length,
                                         int64_t width, int32_t activation, int32_t threads) {
  const auto contract =
      ssmcc::first_error({ssmcc::check_conv("causal_conv1d", batch, dim, length, width),
                          ssmcc::check_activation("causal_conv1d", activation)});
  return guarded(contract, [&] {
    ssmcc::ConvArgs args{x, weight, bias, state0, out, final_state, batch, dim, length, width,
                         static_cast<ssmcc::Activation>(activation)};
    parallel_rows(batch * dim, length * width, threads,
                  [&](int64_t b, int64_t e) { ssmcc::causal_conv1d_rows(args, b, e); });
  });
}

SSMCC_EXPORT int ssmcc_selective_state_update_f32(const float* state, const float* x,
                                                  const float* dt, const float* A, const float* B,
                                                  const float* C, const float* D, const float* z,
                                                  const float* dt_bias, float* out,
                                                  float* new_state, int64_t batch, int64_t dim,
                                                  int64_t groups_b, int64_t groups_c,
                                                  int64_t dstate, int32_t softplus,
                                                  int32_t threads) {
  const auto contract =
      ssmcc::check_scan("selective_state_update", batch, dim, 1, groups_b, groups_c, dstate);
  return guarded(contract, [&] {
    ssmcc::StepArgs args{};
    args.state = state, args.x = x, args.dt = dt, args.A = A, args.B = B, args.C = C;
    args.D = D, args.z = z, args.dt_bias = dt_bias, args.out = out, args.new_state = new_state;
    args.batch = batch, args.dim = dim, args.groups_b = groups_b, args.groups_c = groups_c;
    args.dstate = dstate, args.softplus = softplus != 0;
    parallel_rows(batch * dim, dstate, threads,
                  [&](int64_t b, int64_t e) { ssmcc::selective_state_update_rows(args, b, e); });
  });
}

SSMCC_EXPORT int ssmcc_causal_conv1d_update_f32(const float* x, const float* state,
                                                const float* weight, const float* bias,
                                                float* out, float* new_state, int64_t batch,
                                                int64_t dim, int64_t width, int32_t activation,
                                                int32_t threads) {
  const auto contract =
      ssmcc::first_error({ssmcc::check_conv("causal_conv1d_update", batch, dim, 1, width),
                          ssmcc::check_activation("causal_conv1d_update", activation)});
  return guarded(contract, [&] {
    ssmcc::ConvStepArgs args{x, state, weight, bias, out, new_state, batch, dim, width,
                             static_cast<ssmcc::Activation>(activation)};
    parallel_rows(batch * dim, width, threads,
                  [&](int64_t b, int64_t e) { ssmcc::causal_conv1d_update_rows(args, b, e); });
  });
}

namespace {
// ssd_scan of ``args`` (strides resolved): chunked from kSsdChunkedFrom positions, else
// sequential; rows over the OpenMP team.
void run_ssd_scan(const ssmcc::SsdArgs& args, int threads) {
  const int64_t rows = args.batch * args.heads, work = args.length * args.head_dim * args.dstate;
  if (!ssmcc::ssd_use_chunked(args)) {
    parallel_rows(rows, work, threads,
                  [&](int64_t b, int64_t e) { ssmcc::ssd_scan_rows(args, b, e); });
    return;
  }
  std::vector<float> gram(ssmcc::ssd_gram_floats(args));
  const ssmcc::SsdChunked chunked{args, gram.data()};
  const int64_t Q = ssmcc::kSsdChunk;
  parallel_rows(args.batch * args.groups * ssmcc::ssd_chunks(args), Q * Q * args.dstate, threads,
                [&](int64_t b, int64_t e) { ssmcc::ssd_gram_rows(chunked, b, e); });
  parallel_rows(rows, work, threads,
                [&](int64_t b, int64_t e) { ssmcc::ssd_chunked_rows(chunked, b, e); });
}
}  // namespace

SSMCC_EXPORT int ssmcc_ssd_scan_f32(const float* x, const float* dt, const float* A, const float* B,
                                    const float* C, const float* D, const float* z,
                                    const float* dt_bias, const float* h0, float* out,
                                    float* last, int64_t batch, int64_t length, int64_t heads,
                                    int64_t head_dim, int64_t groups, int64_t dstate,
                                    int64_t x_stride, int64_t dt_stride, int64_t b_stride,
                                    int64_t c_stride, int64_t z_stride, int32_t softplus,
                                    float dt_min, float dt_max, int32_t threads) {
  const auto contract = ssmcc::first_error(
      {ssmcc::check_ssd("ssd_scan", batch, length, heads, head_dim, groups, dstate),
       ssmcc::check_ssd_strides("ssd_scan", heads, head_dim, groups, dstate, x_stride, dt_stride,
                                b_stride, c_stride, z_stride)});
  return guarded(contract, [&] {
    ssmcc::SsdArgs args{x,      dt,     A,     B,        C,      D,      z,
                        dt_bias, h0,    out,   last,     batch,  length, heads,
                        head_dim, groups, dstate, softplus != 0, dt_min, dt_max,
                        x_stride, dt_stride, b_stride, c_stride, z_stride};
    run_ssd_scan(ssmcc::with_strides(args), threads);
  });
}

// ssd_mixer (length >= 0 positions) and ssd_mixer_step (``step``: proj (b, w), length 1).
namespace {
int ssd_mixer_entry(bool step, const float* proj, const float* conv_weight,
                    const float* conv_bias, const float* A, const float* D, const float* dt_bias,
                    const float* norm_weight, const float* conv_state, const float* ssm_state,
                    float* y, float* conv_state_out, float* ssm_state_out, int64_t batch,
                    int64_t length, int64_t width, int64_t heads, int64_t head_dim,
                    int64_t groups, int64_t dstate, int64_t kernel, int64_t z_offset,
                    int64_t xbc_offset, int64_t dt_offset, int64_t norm_group_size,
                    int32_t activation, int32_t softplus, int32_t norm_before_gate,
                    float dt_min, float dt_max, float eps, int32_t threads) {
  const char* op = step ? "ssd_mixer_step" : "ssd_mixer";
  const auto contract = ssmcc::first_error(
      {ssmcc::check_ssd_mixer(op, batch, length, width, heads, head_dim, groups, dstate, kernel,
                              z_offset, xbc_offset, dt_offset, norm_group_size),
       ssmcc::check_activation(op, activation)});
  return guarded(contract, [&] {
    const int64_t channels = heads * head_dim + 2 * groups * dstate;
    std::vector<float> weight_t(step ? 0 : kernel * channels), xbc(batch * length * channels);
    ssmcc::transpose_conv_weight(conv_weight, weight_t.data(), channels, kernel, step);
    const ssmcc::MixerArgs a{proj, conv_weight, conv_bias, weight_t.data(), A, D, dt_bias,
                             norm_weight, conv_state, ssm_state, y, conv_state_out,
                             ssm_state_out, xbc.data(),
                             batch, length, width, heads, head_dim, groups, dstate, kernel,
                             z_offset, xbc_offset, dt_offset, norm_group_size,
                             static_cast<ssmcc::Activation>(activation), softplus != 0,
                             norm_before_gate != 0, dt_min, dt_max, eps};
    const int64_t inner = heads * head_dim;
    if (step) {
      ssmcc::conv_channels_last_step_rows(ssmcc::mixer_conv(a), 0, batch);
      const ssmcc::SsdArgs scan = ssmcc::mixer_scan_args(a);
      // the state update streams the whole state (p n floats a head) through memory: two
      // threads pull more bandwidth than one even at batch 1, so no work threshold here
      parallel_rows(batch * heads, ssmcc::tuning::kParallelWork, threads,
                    [&](int64_t b, int64_t e) { ssmcc::ssd_state_update_rows(scan, b, e); });
    } else {
      const ssmcc::ConvChannelsLast conv = ssmcc::mixer_conv(a);
      parallel_rows(batch * ssmcc::conv_blocks(length),
                    ssmcc::tuning::kMixerConvBlock * channels * kernel, threads,
                    [&](int64_t b, int64_t e) { ssmcc::conv_channels_last_rows(conv, b, e); });
      ssmcc::conv_channels_last_state_out(ssmcc::mixer_conv(a));
      run_ssd_scan(ssmcc::mixer_scan_args(a), threads);
    }
    parallel_rows(batch * length, inner, threads,
                  [&](int64_t b, int64_t e) { ssmcc::mixer_norm_rows(a, b, e); });
  });
}
}  // namespace

SSMCC_EXPORT int ssmcc_ssd_mixer_f32(const float* proj, const float* conv_weight,
                                     const float* conv_bias, const float* A, const float* D,
                                     const float* dt_bias, const float* norm_weight,
                                     const float* conv_state, const float* ssm_state, float* y,
                                     float* conv_state_out, float* ssm_state_out, int64_t batch,
                                     int64_t length, int64_t width, int64_t heads,
                                     int64_t head_dim, int64_t groups, int64_t dstate,
                                     int64_t kernel, int64_t z_offset, int64_t xbc_offset,
                                     int64_t dt_offset, int64_t norm_group_size, int32_t activation,
                                     int32_t softplus, int32_t norm_before_gate, float dt_min,
                                     float dt_max, float eps, int32_t threads) {
  return ssd_mixer_entry(false, proj, conv_weight, conv_bias, A, D, dt_bias, norm_weight,
                         conv_state, ssm_state, y, conv_state_out, ssm_state_out, batch, length,
                         width, heads, head_dim, groups, dstate, kernel, z_offset, xbc_offset,
                         dt_offset, norm_group_size, activation, softplus, norm_before_gate, dt_min,
                         dt_max, eps, threads);
}

SSMCC_EXPORT int ssmcc_ssd_mixer_step_f32(const float* proj, const float* conv_weight,
                                          const float* conv_bias, const float* A, const float* D,
                                          const float* dt_bias, const float* norm_weight,
                                          const float* conv_state, const float* ssm_state,
                                          float* y, float* conv_state_out, float* ssm_state_out,
                                          int64_t batch, int64_t width, int64_t heads,
                                          int64_t head_dim, int64_t groups, int64_t dstate,
                                          int64_t kernel, int64_t z_offset, int64_t xbc_offset,
                                          int64_t dt_offset, int64_t norm_group_size,
                                          int32_t activation, int32_t softplus,
                                          int32_t norm_before_gate, float dt_min, float dt_max,
                                          float eps, int32_t threads) {
  return ssd_mixer_entry(true, proj, conv_weight, conv_bias, A, D, dt_bias, norm_weight,
                         conv_state, ssm_state, y, conv_state_out, ssm_state_out, batch, 1,
                         width, heads, head_dim, groups, dstate, kernel, z_offset, xbc_offset,
                         dt_offset, norm_group_size, activation, softplus, norm_before_gate, dt_min,
                         dt_max, eps, threads);
}

SSMCC_EXPORT int ssmcc_ssd_state_update_f32(const float* state, const float* x, const float* dt,
                                            const float* A, const float* B, const float* C,
                                            const float* D, const float* z, const float* dt_bias,
                                            float* out, float* new_state, int64_t batch,
                                            int64_t heads, int64_t head_dim, int64_t groups,
                                            int64_t dstate, int32_t softplus, float dt_min,
                                            float dt_max, int32_t threads) {
  const auto contract =
      ssmcc::check_ssd("ssd_state_update", batch, 1, heads, head_dim, groups, dstate);
  return guarded(contract, [&] {
    ssmcc::SsdArgs args{x,        dt,     A,      B,   C,   D,     z,      dt_bias,
                        state,    out,    new_state, batch, 1, heads, head_dim, groups,
                        dstate,   softplus != 0, dt_min, dt_max};
    args = ssmcc::with_strides(args);
    parallel_rows(batch * heads, head_dim * dstate, threads,
                  [&](int64_t b, int64_t e) { ssmcc::ssd_state_update_rows(args, b, e); });
  });
}

SSMCC_EXPORT int ssmcc_rmsnorm_gated_f32(const float* x, const float* z, const float* weight,
                                         float* out, int64_t rows, int64_t dim,
                                         int64_t group_size, float eps, int32_t norm_before_gate,
                                         int32_t threads) {
  const auto contract = ssmcc::check_norm("rmsnorm_gated", rows, dim, group_size);
  return guarded(contract, [&] {
    ssmcc::NormArgs args{x, z, weight, out, rows, dim, group_size, eps, norm_before_gate != 0};
    parallel_rows(rows, dim, threads,
                  [&](int64_t b, int64_t e) { ssmcc::rmsnorm_gated_rows(args, b, e); });
  });
}

// out = a + b, elementwise over n floats: the residual add of a replayed step (replay.cpp), bitwise
// ATen's float add, so with denormals kept (the other entries flush them).
SSMCC_EXPORT int ssmcc_add_f32(const float* a, const float* b, float* out, int64_t n) {
  if (n < 0) {
    last_error = ssmcc::check_nonnegative("add", "n", n);
    return 1;
  }
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
  return 0;
}

SSMCC_EXPORT int ssmcc_linear_f32(const float* x, const float* weight, const float* bias, float* y,
                                  int64_t rows, int64_t out_features, int64_t in_features,
                                  int32_t threads) {
  const auto contract = ssmcc::first_error(
      {ssmcc::check_nonnegative("linear", "rows", rows),
       ssmcc::check_nonnegative("linear", "out_features", out_features),
       ssmcc::check_nonnegative("linear", "in_features", in_features)});
  return guarded(contract, [&] {
    const ssmcc::GemvArgs args{x, weight, bias, y, rows, out_features, in_features};
    // split the output features in whole blocks, so every thread streams its own weight rows
    const int64_t blocks = (out_features + ssmcc::kGemvBlock - 1) / ssmcc::kGemvBlock;
    parallel_rows(blocks, rows * in_features * ssmcc::kGemvBlock, threads, [&](int64_t b, int64_t e) {
      ssmcc::gemv_rows(args, b * ssmcc::kGemvBlock,
                       std::min(e * ssmcc::kGemvBlock, out_features));
    });
  });
}

// quantized_linear with few rows of x; ``storage``: 0 int8, 1 bfloat16, 2 float16 (Storage).
namespace {
template <typename W>
void quantized_linear_typed(const float* x, const void* weight, const float* scale,
                            const float* bias, float* y, int64_t rows, int64_t out_features,
                            int64_t in_features, int64_t groups, int32_t threads) {
  const ssmcc::QuantizedGemvArgs<W> args{x,    static_cast<const W*>(weight), scale,       bias,
                                          y,    rows, out_features, in_features, groups};
  const int64_t blocks = (out_features + ssmcc::kQuantizedBlock - 1) / ssmcc::kQuantizedBlock;
  parallel_rows(blocks, rows * in_features * ssmcc::kQuantizedBlock, threads, [&](int64_t b, int64_t e) {
    ssmcc::quantized_gemv_rows(args, b * ssmcc::kQuantizedBlock,
                               std::min(e * ssmcc::kQuantizedBlock, out_features));
  });
}

template <typename W>
void dequantize_typed(const void* weight, const float* scale, float* out, int64_t out_features,
                      int64_t in_features, int64_t groups, int32_t threads) {
  parallel_rows(out_features, in_features, threads, [&](int64_t b, int64_t e) {
    ssmcc::dequantize_rows(static_cast<const W*>(weight), scale, out, in_features, groups, b, e);
  });
}

std::string check_quantized(const char* op, int32_t storage, int64_t rows, int64_t out_features,
                            int64_t in_features, int64_t groups) {
  auto contract = ssmcc::first_error({ssmcc::check_nonnegative(op, "rows", rows),
                                      ssmcc::check_nonnegative(op, "out_features", out_features),
                                      ssmcc::check_nonnegative(op, "in_features", in_features)});
  if (!contract.empty()) return contract;
  if (storage < 0 || storage > 2)
    return std::string(op) + ": storage must be 0 (int8), 1 (bfloat16) or 2 (float16), got " +
           std::to_string(storage);
  if (groups < 1 || in_features % groups != 0)
    return std::string(op) + ": groups=" + std::to_string(groups) + " must divide in_features=" +
           std::to_string(in_features);
  return "";
}
}  // namespace

SSMCC_EXPORT int ssmcc_quantized_linear(const float* x, const void* weight, int32_t storage,
                                        const float* scale, const float* bias, float* y,
                                        int64_t rows, int64_t out_features, int64_t in_features,
                                        int64_t groups, int32_t threads) {
  const auto contract =
      check_quantized("quantized_linear", storage, rows, out_features, in_features, groups);
  return guarded(contract, [&] {
    const auto kind = static_cast<ssmcc::Storage>(storage);
    if (kind == ssmcc::Storage::kInt8)
      quantized_linear_typed<int8_t>(x, weight, scale, bias, y, rows, out_features, in_features,
                                     groups, threads);
    else if (kind == ssmcc::Storage::kBFloat16)
      quantized_linear_typed<uint16_t>(x, weight, scale, bias, y, rows, out_features,
                                       in_features, groups, threads);
    else
      quantized_linear_typed<_Float16>(x, weight, scale, bias, y, rows, out_features,
                                       in_features, groups, threads);
  });
}

SSMCC_EXPORT int ssmcc_dequantize(const void* weight, int32_t storage, const float* scale,
                                  float* out, int64_t out_features, int64_t in_features,
                                  int64_t groups, int32_t threads) {
  const auto contract = check_quantized("dequantize", storage, 0, out_features, in_features, groups);
  return guarded(contract, [&] {
    const auto kind = static_cast<ssmcc::Storage>(storage);
    if (kind == ssmcc::Storage::kInt8)
      dequantize_typed<int8_t>(weight, scale, out, out_features, in_features, groups, threads);
    else if (kind == ssmcc::Storage::kBFloat16)
      dequantize_typed<uint16_t>(weight, scale, out, out_features, in_features, groups, threads);
    else
      dequantize_typed<_Float16>(weight, scale, out, out_features, in_features, groups, threads);
  });
}

// mamba_mixer (``step``: proj (b, w), length 1) and mamba_mixer_step. x_proj / dt_proj: float32
// (storage -1, no scale) or stored small with ``groups`` scales a row (storage as Storage).
namespace {
int mamba_mixer_entry(bool step, const float* proj, const float* conv_weight,
                      const float* conv_bias, const ssmcc::MixerWeight& x_proj,
                      const ssmcc::MixerWeight& dt_proj, const float* A, const float* D,
                      const float* dt_bias, const float* conv_state, const float* ssm_state,
                      float* y, float* conv_state_out, float* ssm_state_out, int64_t batch,
                      int64_t length, int64_t width, int64_t x_offset, int64_t z_offset,
                      int64_t channels, int64_t kernel, int64_t rank, int64_t dstate,
                      int32_t activation, int32_t softplus, int32_t rms, float rms_eps,
                      int32_t threads) {
  const char* op = step ? "mamba_mixer_step" : "mamba_mixer";
  std::string contract = ssmcc::check_mamba_mixer(op, batch, length, width, x_offset, z_offset,
                                                  channels, kernel, rank, dstate);
  if (contract.empty()) contract = ssmcc::check_activation(op, activation);
  const int64_t E = rank + 2 * dstate;
  if (contract.empty()) contract = ssmcc::check_mixer_weight(op, "x_proj", x_proj, channels);
  if (contract.empty()) contract = ssmcc::check_mixer_weight(op, "dt_proj", dt_proj, rank);
  return guarded(contract, [&] {
    const int64_t tokens = batch * length;
    std::vector<float> conv_t(step ? 0 : kernel * channels);
    ssmcc::transpose_conv_weight(conv_weight, conv_t.data(), channels, kernel, step);
    const auto x_proj_t = ssmcc::mixer_weight_dense_t(x_proj, E, channels, step);
    const auto dt_proj_t = ssmcc::mixer_weight_dense_t(dt_proj, channels, rank, step);
    const auto A_t = ssmcc::transposed(A, channels, dstate, step);
    std::vector<float> xc(tokens * channels), dbc(tokens * E), dt(tokens * channels);
    const ssmcc::MambaMixerArgs a{
        proj,      conv_weight,      conv_t.data(),    conv_bias,      x_proj,
        x_proj_t.data(), dt_proj,    dt_proj_t.data(), A,              A_t.data(),
        D,         dt_bias,          conv_state,       ssm_state,      y,
        conv_state_out,  ssm_state_out, xc.data(),     dbc.data(),     dt.data(),
        batch,     length,           width,            x_offset,       z_offset,
        channels,  kernel,           rank,             dstate,
        static_cast<ssmcc::Activation>(activation),
        softplus != 0,   rms != 0,   rms_eps};
    const ssmcc::ConvChannelsLast conv = ssmcc::mamba_mixer_conv(a);
    if (step) {
      ssmcc::conv_channels_last_step_rows(conv, 0, batch);
      std::vector<float> B(batch * dstate), C(batch * dstate), z(batch * channels);
      const ssmcc::MambaStep s{&a, B.data(), C.data(), z.data()};
      // work per row in bytes read: the phases stream weights (and states) from memory
      parallel_rows(E, 4 * channels * batch, threads, [&](int64_t b, int64_t e) {
        ssmcc::mamba_step_project_rows(s, b, e);
      });
      ssmcc::mamba_step_split(s);
      const int64_t row_bytes = 4 * (rank + 3 * dstate);
      parallel_rows(batch * channels, row_bytes, threads, [&](int64_t b, int64_t e) {
        ssmcc::mamba_step_channel_rows(s, b, e);
      });
      return;
    }
    const int64_t block = ssmcc::tuning::kMixerConvBlock;
    parallel_rows(batch * ssmcc::conv_blocks(length), block * channels * kernel, threads,
                  [&](int64_t b, int64_t e) { ssmcc::conv_channels_last_rows(conv, b, e); });
    ssmcc::conv_channels_last_state_out(conv);
    parallel_rows((tokens + block - 1) / block, block * channels * E, threads,
                  [&](int64_t b, int64_t e) { ssmcc::mamba_projection_rows(a, b, e); });
    parallel_rows(batch * ssmcc::mamba_scan_groups(a),
                  length * dstate * ssmcc::gemm::kLanes, threads,
                  [&](int64_t b, int64_t e) { ssmcc::mamba_scan_rows(a, b, e); });
  });
}
}  // namespace

SSMCC_EXPORT int ssmcc_mamba_mixer_f32(
    const float* proj, const float* conv_weight, const float* conv_bias, const void* x_proj,
    const void* dt_proj, const float* A, const float* D, const float* dt_bias,
    const float* conv_state, const float* ssm_state, float* y, float* conv_state_out,
    float* ssm_state_out, int64_t batch, int64_t length, int64_t width, int64_t x_offset,
    int64_t z_offset, int64_t channels, int64_t kernel, int64_t rank, int64_t dstate,
    int32_t activation, int32_t softplus, int32_t rms, float rms_eps, const float* x_proj_scale,
    int32_t x_proj_storage, int64_t x_proj_groups, const float* dt_proj_scale,
    int32_t dt_proj_storage, int64_t dt_proj_groups, int32_t threads) {
  return mamba_mixer_entry(false, proj, conv_weight, conv_bias,
                           {x_proj, x_proj_scale, x_proj_storage, x_proj_groups},
                           {dt_proj, dt_proj_scale, dt_proj_storage, dt_proj_groups}, A, D,
                           dt_bias, conv_state, ssm_state, y, conv_state_out, ssm_state_out,
                           batch, length, width, x_offset, z_offset, channels, kernel, rank,
                           dstate, activation, softplus, rms, rms_eps, threads);
}

SSMCC_EXPORT int ssmcc_mamba_mixer_step_f32(
    const float* proj, const float* conv_weight, const float* conv_bias, const void* x_proj,
    const void* dt_proj, const float* A, const float* D, const float* dt_bias,
    const float* conv_state, const float* ssm_state, float* y, float* conv_state_out,
    float* ssm_state_out, int64_t batch, int64_t width, int64_t x_offset, int64_t z_offset,
    int64_t channels, int64_t kernel, int64_t rank, int64_t dstate, int32_t activation,
    int32_t softplus, int32_t rms, float rms_eps, const float* x_proj_scale,
    int32_t x_proj_storage, int64_t x_proj_groups, const float* dt_proj_scale,
    int32_t dt_proj_storage, int64_t dt_proj_groups, int32_t threads) {
  return mamba_mixer_entry(true, proj, conv_weight, conv_bias,
                           {x_proj, x_proj_scale, x_proj_storage, x_proj_groups},
                           {dt_proj, dt_proj_scale, dt_proj_storage, dt_proj_groups}, A, D,
                           dt_bias, conv_state, ssm_state, y, conv_state_out, ssm_state_out,
                           batch, 1, width, x_offset, z_offset, channels, kernel, rank, dstate,
                           activation, softplus, rms, rms_eps, threads);
}

// moe_experts for a few tokens (moe_experts.h): only the chosen experts' weights are read, once
// each. up / down: float32 (storage -1, scale null) or stored small, as a mixer's weights.
SSMCC_EXPORT int ssmcc_moe_experts(const float* hidden, const int64_t* index, const float* weights,
                                   const void* up, int32_t up_storage, const float* up_scale,
                                   int64_t up_groups, const void* down, int32_t down_storage,
                                   const float* down_scale, int64_t down_groups, float* out,
                                   int64_t tokens, int64_t k, int64_t experts, int64_t d,
                                   int64_t width, int32_t gated, int32_t activation,
                                   int32_t threads) {
  const ssmcc::MixerWeight up_w{up, up_scale, up_storage, up_groups};
  const ssmcc::MixerWeight down_w{down, down_scale, down_storage, down_groups};
  const auto contract = ssmcc::first_error(
      {ssmcc::check_nonnegative("moe_experts", "tokens", tokens),
       ssmcc::check_nonnegative("moe_experts", "k", k),
       ssmcc::check_nonnegative("moe_experts", "experts", experts),
       ssmcc::check_nonnegative("moe_experts", "d", d),
       ssmcc::check_nonnegative("moe_experts", "width", width),
       ssmcc::check_expert_activation("moe_experts", activation),
       ssmcc::check_mixer_weight("moe_experts", "up", up_w, d),
       ssmcc::check_mixer_weight("moe_experts", "down", down_w, width)});
  return guarded(contract, [&] {
    const ssmcc::MoeArgs args{hidden, index, weights, up_w,  down_w, out,        tokens,
                              k,      experts, d,     width, gated != 0, activation};
    ssmcc::MoePlan plan(args);
    const ssmcc::MoePhase up_phase = ssmcc::moe_up_phase(args, plan);
    parallel_rows(ssmcc::moe_tasks(up_phase), up_phase.block * d * (gated ? 2 : 1), threads,
                  [&](int64_t b, int64_t e) { ssmcc::moe_up_tasks(up_phase, b, e); });
    const ssmcc::MoePhase down_phase = ssmcc::moe_down_phase(args, plan);
    parallel_rows(ssmcc::moe_tasks(down_phase), down_phase.block * width, threads,
                  [&](int64_t b, int64_t e) { ssmcc::moe_down_tasks(down_phase, b, e); });
    ssmcc::moe_combine(args, plan);
  });
}
