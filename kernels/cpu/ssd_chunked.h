// ssd_scan by SSD's block decomposition (Dao & Gu 2024, "Transformers are SSMs", section 6): the
// same recurrence as ssd_kernels.h, regrouped into small matrix products (small_gemm.h).
//
// The sequence is cut into chunks of Q = kSsdChunk positions. Per head, with a_t = dt_t A and the
// in-chunk cumulative sums s_t = a_{t0} + ... + a_t, for positions tau <= t of one chunk:
//   y_t    = sum_{tau<=t} (C_t . B_tau) exp(s_t - s_tau) dt_tau x_tau      (within the chunk)
//          + exp(s_t) C_t . h_prev                                         (the state entering it)
//          + D x_t,   then the gate silu(z_t)
//   h_next = exp(s_last) h_prev + sum_tau exp(s_last - s_tau) dt_tau x_tau (x) B_tau
// Every exponent is a sum of a_t over a span of positions, so for A < 0 and dt >= 0 (the op's
// domain) nothing overflows. Per chunk the work is four products:
//   G   = C B^T                    Q x Q, once per (batch, group, chunk), shared by the group's
//                                  heads (phase 1, ssd_gram_rows)
//   Y   = (G o L) X                L[t, tau] = exp(s_t - s_tau) dt_tau for tau <= t, else 0
//   Y  += (exp(s) o C) H^T         H^T: the state as (n, p), so that p is the contiguous dim
//   H^T = exp(s_last) H^T + (w o B)^T X,   w_tau = exp(s_last - s_tau) dt_tau
// That is 4 n p + Q p + 2 Q n / (heads per group) flops per position and head: as many as the
// sequential form, but in register-tiled products, and the state is read once per chunk instead
// of once per position (phase 2, ssd_chunked_rows: rows = (batch, head)).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "small_gemm.h"
#include "ssd_kernels.h"
#include "tuning.h"

namespace ssmcc {

using tuning::kSsdChunk;

inline int64_t ssd_chunks(const SsdArgs& a) { return (a.length + kSsdChunk - 1) / kSsdChunk; }

// Whether ssd_scan runs chunked (long enough for the products to pay).
inline bool ssd_use_chunked(const SsdArgs& a) { return a.length >= tuning::kSsdChunkedFrom; }

// Floats of phase 1's scratch: G for every (batch, group, chunk).
inline int64_t ssd_gram_floats(const SsdArgs& a) {
  return a.batch * a.groups * ssd_chunks(a) * kSsdChunk * kSsdChunk;
}

struct SsdChunked {
  SsdArgs a;    // strides resolved (with_strides)
  float* gram;  // ssd_gram_floats(a)
};

// Phase 1 over rows (batch, group, chunk): G[t, tau] = C_t . B_tau (row stride Q).
inline void ssd_gram_rows(const SsdChunked& s, int64_t begin, int64_t end) {
  const SsdArgs& a = s.a;
  const int64_t Q = kSsdChunk, N = a.dstate, chunks = ssd_chunks(a);
  std::vector<float> B_transposed(N * Q);
  for (int64_t row = begin; row < end; ++row) {
    const int64_t chunk = row % chunks, g = (row / chunks) % a.groups, b = row / chunks / a.groups;
    const int64_t t0 = chunk * Q, size = std::min(Q, a.length - t0), token0 = b * a.length + t0;
    const float* B = a.B + token0 * a.b_stride + g * N;
    const float* C = a.C + token0 * a.c_stride + g * N;
    for (int64_t tau = 0; tau < size; ++tau)
      for (int64_t n = 0; n < N; ++n) B_transposed[n * size + tau] = B[tau * a.b_stride + n];
    gemm::matmul(size, size, N, C, a.c_stride, 1, B_transposed.data(), size, s.gram + row * Q * Q,
                 Q, false);
  }
}

// Phase 2 over rows (batch, head): the chunks in order, the state carried as H^T (n, p).
inline void ssd_chunked_rows(const SsdChunked& s, int64_t begin, int64_t end) {
  const SsdArgs& a = s.a;
  const int64_t Q = kSsdChunk, H = a.heads, P = a.head_dim, N = a.dstate;
  const int64_t per_group = H / a.groups, chunks = ssd_chunks(a);
  std::vector<float> state(N * P), mixing(Q * Q), scaled(Q * N), dt(Q), cum(Q);
  float* hT = state.data();
  for (int64_t row = begin; row < end; ++row) {
    const int64_t b = row / H, head = row % H, g = head / per_group;
    const float A = a.A[head];
    const float* D = a.D ? a.D + head * P : nullptr;
    const float* h0 = a.h0 ? a.h0 + row * P * N : nullptr;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t p = 0; p < P; ++p) hT[n * P + p] = h0 ? h0[p * N + n] : 0.f;
    bool zero_state = h0 == nullptr;
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      const int64_t t0 = chunk * Q, size = std::min(Q, a.length - t0), token0 = b * a.length + t0;
      const float* x = a.x + token0 * a.x_stride + head * P;
      const float* B = a.B + token0 * a.b_stride + g * N;
      const float* C = a.C + token0 * a.c_stride + g * N;
      float* y = a.out + token0 * a.out_stride + head * P;
      const float* G = s.gram + ((b * a.groups + g) * chunks + chunk) * Q * Q;
      float running = 0.f;
      for (int64_t tau = 0; tau < size; ++tau) {
        dt[tau] = ssd_dt(a, a.dt[(token0 + tau) * a.dt_stride + head], head);
        running += dt[tau] * A;
        cum[tau] = running;
      }
      // Y = (G o L) X; L is lower triangular, zeros stored up to the chunk's width
      for (int64_t t = 0; t < size; ++t) {
        float* m = mixing.data() + t * Q;
        const float* gt = G + t * Q;
        const float st = cum[t];
#pragma omp simd
        for (int64_t tau = 0; tau <= t; ++tau) m[tau] = gt[tau] * std::exp(st - cum[tau]) * dt[tau];
        for (int64_t tau = t + 1; tau < size; ++tau) m[tau] = 0.f;
      }
      gemm::matmul(size, P, size, mixing.data(), Q, 1, x, a.x_stride, y, a.out_stride, false, true);
      // Y += (exp(s) o C) H^T
      if (!zero_state) {
        for (int64_t t = 0; t < size; ++t) {
          const float e = std::exp(cum[t]);
#pragma omp simd
          for (int64_t n = 0; n < N; ++n) scaled[t * N + n] = C[t * a.c_stride + n] * e;
        }
        gemm::matmul(size, P, N, scaled.data(), N, 1, hT, P, y, a.out_stride, true);
      }
      // H^T = exp(s_last) H^T + (w o B)^T X
      const float s_last = cum[size - 1];
      for (int64_t tau = 0; tau < size; ++tau) {
        const float w = std::exp(s_last - cum[tau]) * dt[tau];
#pragma omp simd
        for (int64_t n = 0; n < N; ++n) scaled[tau * N + n] = B[tau * a.b_stride + n] * w;
      }
      if (!zero_state) {
        const float keep = std::exp(s_last);
#pragma omp simd
        for (int64_t i = 0; i < N * P; ++i) hT[i] *= keep;
      }
      gemm::matmul(N, P, size, scaled.data(), 1, N, x, a.x_stride, hT, P, true);
      zero_state = false;
      // y += D x, then the gate
      for (int64_t t = 0; t < size; ++t) {
        float* yt = y + t * a.out_stride;
        const float* xt = x + t * a.x_stride;
        if (D) {
#pragma omp simd
          for (int64_t p = 0; p < P; ++p) yt[p] += D[p] * xt[p];
        }
        if (a.z) {
          const float* zt = a.z + (token0 + t) * a.z_stride + head * P;
#pragma omp simd
          for (int64_t p = 0; p < P; ++p) yt[p] *= zt[p] / (1.f + std::exp(-zt[p]));
        }
      }
    }
    float* last = a.last + row * P * N;
    for (int64_t p = 0; p < P; ++p)
      for (int64_t n = 0; n < N; ++n) last[p * N + n] = hT[n * P + p];
  }
}

}  // namespace ssmcc
