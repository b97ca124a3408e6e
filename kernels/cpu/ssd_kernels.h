// ssmcc CPU kernels for the Mamba-2 ops: float32, one function per op over a range of rows
// (row = batch * heads + head for the scans, one normalised vector for the norm). The scans read
// x, dt, B, C, z with a token stride (SsdArgs); everything else is packed.
//
// ssd_scan (math: ssmcc/ops/ssd_scan.py), per row (b, i) with group g = i / (heads / groups):
//   dt_t = clamp(softplus(dt_t + dt_bias), dt_min, dt_max)      (softplus, bias when requested)
//   h_t[p,n] = exp(dt_t A[i]) h_{t-1}[p,n] + dt_t x_t[p] B_t[g,n]
//   y_t[p] = sum_n C_t[g,n] h_t[p,n] + D[i,p] x_t[p];   y_t *= silu(z_t) if z
// The row's state (p x n) lives in the final-state output while the scan runs; the n loop
// vectorises. Sequences of kSsdChunkedFrom positions or more run chunked (ssd_chunked.h), with
// the same result. ssd_state_update is one such step from a given state. D arrives as (heads, p).
// rmsnorm_gated (ssmcc/ops/rmsnorm_gated.py), per vector of d channels in groups of group_size:
//   norm_before_gate = 0: out = w * norm(x * silu(z));  1: out = w * norm(x) * silu(z)
// Optional pointers (D, z, dt_bias, h0) may be null: zero / no gate / zeros. The sizes must satisfy
// the input contracts of contracts.h (every binding checks them first).
#pragma once

#include <cmath>
#include <cstdint>

#include "small_gemm.h"
#include "ssm_kernels.h"

namespace ssmcc {

struct SsdArgs {
  const float *x, *dt, *A, *B, *C, *D, *z, *dt_bias, *h0;  // h0: (b, h, p, n) or null
  float *out, *last;                                        // last: (b, h, p, n)
  int64_t batch, length, heads, head_dim, groups, dstate;
  bool softplus;
  float dt_min, dt_max;
  // Elements from one token to the next (for a step: from one batch row to the next) in x, dt,
  // B, C, z and out; 0 = packed (h*p, h, g*n, g*n, h*p, h*p). Inner dims are always packed, and
  // batch row b starts at token b * length. A strided x/B/C/dt/z is a view into a wider
  // projection output, read in place.
  int64_t x_stride = 0, dt_stride = 0, b_stride = 0, c_stride = 0, z_stride = 0, out_stride = 0;
};

// ``a`` with every stride resolved (0 -> packed).
inline SsdArgs with_strides(SsdArgs a) {
  const int64_t hp = a.heads * a.head_dim, gn = a.groups * a.dstate;
  if (!a.x_stride) a.x_stride = hp;
  if (!a.dt_stride) a.dt_stride = a.heads;
  if (!a.b_stride) a.b_stride = gn;
  if (!a.c_stride) a.c_stride = gn;
  if (!a.z_stride) a.z_stride = hp;
  if (!a.out_stride) a.out_stride = hp;
  return a;
}

inline float ssd_dt(const SsdArgs& a, float raw, int64_t head) {
  float v = raw + (a.dt_bias ? a.dt_bias[head] : 0.f);
  if (a.softplus) v = softplus(v);
  return std::fmin(std::fmax(v, a.dt_min), a.dt_max);
}

// One position of one row: h = decay h_in + dt x B; out = C.h + D x (gated). ``h_in``, ``h``:
// (p, n); they may be the same buffer (the scan updates in place; a step reads the state in and
// writes the state out in one pass).
inline void ssd_position(const SsdArgs& a, int64_t head, float step, const float* x,
                         const float* B, const float* C, const float* z, const float* h_in,
                         float* h, float* out) {
  const int64_t n_state = a.dstate;
  const float decay = std::exp(step * a.A[head]);
  const float* D = a.D ? a.D + head * a.head_dim : nullptr;
  for (int64_t p = 0; p < a.head_dim; ++p) {
    const float drive = step * x[p];
    const float* hp_in = h_in + p * n_state;
    float* hp = h + p * n_state;
    float acc = 0.f;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < n_state; ++i) {
      const float hi = decay * hp_in[i] + drive * B[i];
      hp[i] = hi;
      acc += hi * C[i];
    }
    float y = acc + (D ? D[p] * x[p] : 0.f);
    if (z) y *= silu(z[p]);
    out[p] = y;
  }
}

// The sequential recurrence over rows [row_begin, row_end) of (batch, head); strides resolved.
inline void ssd_scan_rows(const SsdArgs& a, int64_t row_begin, int64_t row_end) {
  const int64_t H = a.heads, P = a.head_dim, N = a.dstate, per_group = a.heads / a.groups;
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t b = row / H, head = row % H, g = head / per_group;
    float* h = a.last + row * P * N;
    for (int64_t i = 0; i < P * N; ++i) h[i] = a.h0 ? a.h0[row * P * N + i] : 0.f;
    for (int64_t t = 0; t < a.length; ++t) {
      const int64_t token = b * a.length + t;  // (b, t)
      const float step = ssd_dt(a, a.dt[token * a.dt_stride + head], head);
      const float* Bt = a.B + token * a.b_stride + g * N;
      const float* Ct = a.C + token * a.c_stride + g * N;
      const float* z = a.z ? a.z + token * a.z_stride + head * P : nullptr;
      ssd_position(a, head, step, a.x + token * a.x_stride + head * P, Bt, Ct, z, h, h,
                   a.out + token * a.out_stride + head * P);
    }
  }
}

// One step of one row whose new state goes to memory with non-temporal stores: in decode the
// state is read once and written once per token and not read again before every weight has
// streamed through the caches, so writing it around them saves the read-for-ownership of every
// line (a third of the state's traffic). Needs n a multiple of the vector width and the new
// state aligned to it (checked by the caller); same arithmetic as ssd_position.
inline void ssd_position_streaming(const SsdArgs& a, int64_t head, float step, const float* x,
                                   const float* B, const float* C, const float* z,
                                   const float* h_in, float* h, float* out) {
  using gemm::vfloat;
  const int64_t n_state = a.dstate;
  const float decay = std::exp(step * a.A[head]);
  const float* D = a.D ? a.D + head * a.head_dim : nullptr;
  for (int64_t p = 0; p < a.head_dim; ++p) {
    const float drive = step * x[p];
    const float* hp_in = h_in + p * n_state;
    float* hp = h + p * n_state;
    vfloat acc = {};
    for (int64_t i = 0; i < n_state; i += gemm::kLanes) {
      const vfloat hi = decay * gemm::load(hp_in + i) + drive * gemm::load(B + i);
      gemm::store_streaming(hp + i, hi);
      acc += hi * gemm::load(C + i);
    }
    float y = D ? D[p] * x[p] : 0.f;
    for (int lane = 0; lane < gemm::kLanes; ++lane) y += acc[lane];
    if (z) y *= silu(z[p]);
    out[p] = y;
  }
}

// ssd_state_update: ``h0`` is the state in, ``last`` the state out, length 1; a "token" is a
// batch row. Strides resolved.
inline void ssd_state_update_rows(const SsdArgs& a, int64_t row_begin, int64_t row_end) {
  const int64_t H = a.heads, P = a.head_dim, N = a.dstate, per_group = a.heads / a.groups;
  const bool streaming = N % gemm::kLanes == 0 &&
                         reinterpret_cast<uintptr_t>(a.last) % sizeof(gemm::vfloat) == 0;
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t b = row / H, head = row % H, g = head / per_group;
    const float step = ssd_dt(a, a.dt[b * a.dt_stride + head], head);
    const float* B = a.B + b * a.b_stride + g * N;
    const float* C = a.C + b * a.c_stride + g * N;
    const float* z = a.z ? a.z + b * a.z_stride + head * P : nullptr;
    const float* x = a.x + b * a.x_stride + head * P;
    float* out = a.out + b * a.out_stride + head * P;
    if (streaming)
      ssd_position_streaming(a, head, step, x, B, C, z, a.h0 + row * P * N, a.last + row * P * N,
                             out);
    else
      ssd_position(a, head, step, x, B, C, z, a.h0 + row * P * N, a.last + row * P * N, out);
  }
  if (streaming) gemm::streaming_done();
}

struct NormArgs {
  const float *x, *z, *weight;  // x, z: (rows, d); weight (d)
  float* out;                   // may be x (the norm runs in place)
  int64_t rows, dim, group_size;
  float eps;
  bool norm_before_gate;
  int64_t z_stride = 0;  // elements from one row of z to the next; 0: d
};

inline void rmsnorm_gated_rows(const NormArgs& a, int64_t row_begin, int64_t row_end) {
  const int64_t d = a.dim, gs = a.group_size, z_stride = a.z_stride ? a.z_stride : d;
  for (int64_t row = row_begin; row < row_end; ++row) {
    const float* x = a.x + row * d;
    const float* z = a.z ? a.z + row * z_stride : nullptr;
    float* out = a.out + row * d;
    if (z && !a.norm_before_gate) {
#pragma omp simd
      for (int64_t c = 0; c < d; ++c) out[c] = x[c] * z[c] / (1.f + std::exp(-z[c]));
    } else {
      for (int64_t c = 0; c < d; ++c) out[c] = x[c];
    }
    for (int64_t first = 0; first < d; first += gs) {
      float squares = 0.f;
#pragma omp simd reduction(+ : squares)
      for (int64_t c = first; c < first + gs; ++c) squares += out[c] * out[c];
      const float scale = 1.f / std::sqrt(squares / static_cast<float>(gs) + a.eps);
#pragma omp simd
      for (int64_t c = first; c < first + gs; ++c) out[c] *= scale * a.weight[c];
    }
    if (z && a.norm_before_gate) {
#pragma omp simd
      for (int64_t c = 0; c < d; ++c) out[c] *= z[c] / (1.f + std::exp(-z[c]));
    }
  }
}

}  // namespace ssmcc
