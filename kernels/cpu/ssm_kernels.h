// ssmcc CPU kernels: float32, contiguous, one function per op over a range of rows
// (row = batch * dim + channel), so each binding chooses its own threading.
//
// selective_scan (math: ssmcc/ops/selective_scan.py), per row, with B's group of channel c
// gb = c / (dim / groups_b) and C's gc = c / (dim / groups_c) (B and C are grouped independently):
//   dt_t = delta_t + delta_bias;  dt_t = softplus(dt_t) if softplus   (softplus(x) = x for x > 20)
//   h_t[i] = exp(dt_t * A[c,i]) * h_{t-1}[i] + dt_t * u_t * B_t[gb,i]
//   y_t = sum_i C_t[gc,i] h_t[i] + D[c] u_t;   y_t *= silu(z_t) if z
// B and C arrive transposed to (batch, groups, length, state) so the state loop is contiguous and
// vectorises (with -ffast-math GCC calls glibc's vector expf; the one-step update, one call per
// row, uses vector_math.h's inline exp when the state is whole vectors); softplus, the D skip and the gate
// run in separate loops over t, which vectorise too.
// causal_conv1d: out_t = act(bias + sum_j w[j] xs[t + j]), xs = (state[k-1], x[l]), act one of
// activations.h; the final
// state is the last k-1 entries of xs. The *_update kernels are the one-step forms.
// Optional pointers (D, z, delta_bias, h0, bias, state) may be null: zero / no gate.
// The sizes must satisfy the input contracts of contracts.h (every binding checks them first):
// then no index below leaves its buffer.
#pragma once

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <vector>

#include "activations.h"
#include "gemv.h"
#include "tuning.h"
#include "vector_math.h"

namespace ssmcc {

inline float softplus(float x) { return x > 20.f ? x : std::log1p(std::exp(x)); }
inline float silu(float x) { return x / (1.f + std::exp(-x)); }

struct ScanArgs {
  const float *u, *delta, *A, *D, *z, *delta_bias, *h0;
  const float *Bt, *Ct;  // (b, groups_b, l, n), (b, groups_c, l, n)
  float *out, *last;
  int64_t batch, dim, length, groups_b, groups_c, dstate;
  bool softplus;
};

// softplus as torch computes it (identity above 20), in a form GCC vectorises (expf/logf).
inline float softplus_vectorizable(float x) {
  const float e = std::exp(x < 20.f ? x : 20.f);
  return x > 20.f ? x : std::log(1.f + e);
}

// kState > 0: the state size is known when compiling, so the state of a row stays in registers
// across time steps (about 25% faster at n = 16); kState = 0: any size, read from ``a``.
template <int64_t kState>
inline void selective_scan_rows_impl(const ScanArgs& a, int64_t row_begin, int64_t row_end) {
  const int64_t n_state = kState > 0 ? kState : a.dstate, length = a.length;
  const int64_t per_group_b = a.dim / a.groups_b, per_group_c = a.dim / a.groups_c;
  float h_fixed[kState > 0 ? kState : 1];
  std::vector<float> h_any(kState > 0 ? 0 : n_state), dt_row(length), y_row(length);
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t b = row / a.dim, c = row % a.dim;
    const int64_t gb = c / per_group_b, gc = c / per_group_c;
    const float* A = a.A + c * n_state;
    const float* u = a.u + row * length;
    const float* delta = a.delta + row * length;
    const float* Bs = a.Bt + (b * a.groups_b + gb) * length * n_state;
    const float* Cs = a.Ct + (b * a.groups_c + gc) * length * n_state;
    const float bias = a.delta_bias ? a.delta_bias[c] : 0.f;
    float* dt = dt_row.data();
    float* y = y_row.data();
    // per-step scalars first, in loops over t that vectorise
    for (int64_t t = 0; t < length; ++t) dt[t] = delta[t] + bias;
    if (a.softplus)
      for (int64_t t = 0; t < length; ++t) dt[t] = softplus_vectorizable(dt[t]);
    float* hp = kState > 0 ? h_fixed : h_any.data();
    for (int64_t i = 0; i < n_state; ++i) hp[i] = a.h0 ? a.h0[row * n_state + i] : 0.f;
    // the recurrence: sequential in t, vectorised over the state
    for (int64_t t = 0; t < length; ++t) {
      const float dt_t = dt[t], du = dt_t * u[t];
      const float* Bt = Bs + t * n_state;
      const float* Ct = Cs + t * n_state;
      float acc = 0.f;
#pragma omp simd reduction(+ : acc)
      for (int64_t i = 0; i < n_state; ++i) {
        const float hi = std::exp(dt_t * A[i]) * hp[i] + du * Bt[i];
        hp[i] = hi;
        acc += hi * Ct[i];
      }
      y[t] = acc;
    }
    // epilogue: D skip and silu gate, vectorised over t
    const float skip = a.D ? a.D[c] : 0.f;
    float* out = a.out + row * length;
    if (a.z) {
      const float* z = a.z + row * length;
      for (int64_t t = 0; t < length; ++t)
        out[t] = (y[t] + skip * u[t]) * (z[t] / (1.f + std::exp(-z[t])));
    } else {
      for (int64_t t = 0; t < length; ++t) out[t] = y[t] + skip * u[t];
    }
    for (int64_t i = 0; i < n_state; ++i) a.last[row * n_state + i] = hp[i];
  }
}

inline void selective_scan_rows(const ScanArgs& a, int64_t row_begin, int64_t row_end) {
  switch (a.dstate) {
    case 4: return selective_scan_rows_impl<4>(a, row_begin, row_end);
    case 8: return selective_scan_rows_impl<8>(a, row_begin, row_end);
    case 16: return selective_scan_rows_impl<16>(a, row_begin, row_end);
    case 32: return selective_scan_rows_impl<32>(a, row_begin, row_end);
    default: return selective_scan_rows_impl<0>(a, row_begin, row_end);
  }
}

// (b, g, n, l) -> (b, g, l, n)
inline void transpose_state_length(const float* src, float* dst, int64_t outer, int64_t n_state,
                                   int64_t length) {
  for (int64_t o = 0; o < outer; ++o) {
    const float* s = src + o * n_state * length;
    float* d = dst + o * n_state * length;
    for (int64_t i = 0; i < n_state; ++i)
      for (int64_t t = 0; t < length; ++t) d[t * n_state + i] = s[i * length + t];
  }
}

struct ConvArgs {
  const float *x, *weight, *bias, *state0;  // state0: (b, d, k-1) or null
  float *out, *final_state;
  int64_t batch, dim, length, width;
  Activation activation;
};

inline void causal_conv1d_rows(const ConvArgs& a, int64_t row_begin, int64_t row_end) {
  const int64_t k = a.width, history = k - 1, length = a.length;
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t c = row % a.dim;
    const float* x = a.x + row * length;
    const float* w = a.weight + c * k;
    const float* prev = a.state0 ? a.state0 + row * history : nullptr;
    const float bias = a.bias ? a.bias[c] : 0.f;
    float* out = a.out + row * length;
    // xs = (prev[0..history), x[0..length)); out[t] = bias + sum_j w[j] xs[t + j]
    for (int64_t t = 0; t < length; ++t) out[t] = bias;
    for (int64_t j = 0; j < k; ++j) {
      const float wj = w[j];
      const int64_t shift = j - history;  // xs[t + j] = x[t + shift] when t + shift >= 0
      const int64_t first = shift < 0 ? std::min(-shift, length) : 0;
      for (int64_t t = 0; t < first; ++t) out[t] += wj * (prev ? prev[t + j] : 0.f);
      for (int64_t t = first; t < length; ++t) out[t] += wj * x[t + shift];
    }
    activate_span(out, length, a.activation);
    float* fin = a.final_state + row * history;
    for (int64_t p = 0; p < history; ++p) {
      const int64_t index = length + p;  // xs index
      fin[p] = index < history ? (prev ? prev[index] : 0.f) : x[index - history];
    }
  }
}

struct StepArgs {
  const float *state, *x, *dt, *A, *B, *C, *D, *z, *dt_bias;  // B (b, gb, n), C (b, gc, n)
  float *out, *new_state;
  int64_t batch, dim, groups_b, groups_c, dstate;
  bool softplus;
};

using tuning::kStepBlock;
constexpr int kStepRows = 4;  // rows of a state update interleaved (state_update_vector_rows)

// Rows row0 .. row0 + G - 1 of selective_state_update with n a multiple of the vector width
// (vector_math.h's inline exp): the G rows' chains interleaved. One row at a time, the exp and
// the lane sum of a row (n = 16: two vectors) wait on each other; G independent rows keep the
// FP units busy (mamba-130m's step, one Zen 3 core: 35 -> 24 us; 2 and 8 rows measured alike).
template <int G>
inline void state_update_vector_rows(const StepArgs& a, int64_t row0, const float* dt_block,
                                     const float* gate_block) {
  using gemm::vfloat;
  const int64_t n_state = a.dstate;
  const int64_t per_group_b = a.dim / a.groups_b, per_group_c = a.dim / a.groups_c;
  const float *A[G], *B[G], *C[G], *h[G];
  float* hn[G];
  float du[G];
  vfloat acc[G];
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) {
    const int64_t row = row0 + g, b = row / a.dim, c = row % a.dim;
    A[g] = a.A + c * n_state;
    B[g] = a.B + (b * a.groups_b + c / per_group_b) * n_state;
    C[g] = a.C + (b * a.groups_c + c / per_group_c) * n_state;
    h[g] = a.state + row * n_state;
    hn[g] = a.new_state + row * n_state;
    du[g] = dt_block[g] * a.x[row];
    acc[g] = vfloat{};
  }
  for (int64_t i = 0; i < n_state; i += gemm::kLanes) {
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      const vfloat hi = exp_vector(dt_block[g] * gemm::load(A[g] + i)) * gemm::load(h[g] + i) +
                        du[g] * gemm::load(B[g] + i);
      gemm::store(hn[g] + i, hi);
      acc[g] += hi * gemm::load(C[g] + i);
    }
  }
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g) {
    const int64_t row = row0 + g;
    const float y = lane_sum(acc[g]) + (a.D ? a.D[row % a.dim] : 0.f) * a.x[row];
    a.out[row] = a.z ? y * gate_block[g] : y;
  }
}

inline void selective_state_update_rows(const StepArgs& a, int64_t row_begin, int64_t row_end) {
  const int64_t n_state = a.dstate;
  const int64_t per_group_b = a.dim / a.groups_b, per_group_c = a.dim / a.groups_c;
  float dt_block[kStepBlock], gate_block[kStepBlock];
  for (int64_t first = row_begin; first < row_end; first += kStepBlock) {
    const int64_t count = std::min(kStepBlock, row_end - first);
    for (int64_t r = 0; r < count; ++r)
      dt_block[r] = a.dt[first + r] + (a.dt_bias ? a.dt_bias[(first + r) % a.dim] : 0.f);
    // softplus and the gate on whole vectors (vector_math.h's inline exp: one libm call per
    // element would cost more than the state update itself), the remainder one by one
    const int64_t whole = count - count % gemm::kLanes;
    if (a.softplus) {
      for (int64_t r = 0; r < whole; r += gemm::kLanes)
        gemm::store(dt_block + r, softplus_vector(gemm::load(dt_block + r)));
      for (int64_t r = whole; r < count; ++r) dt_block[r] = softplus_vectorizable(dt_block[r]);
    }
    if (a.z) {
      for (int64_t r = 0; r < whole; r += gemm::kLanes)
        gemm::store(gate_block + r, silu_vector(gemm::load(a.z + first + r)));
      for (int64_t r = whole; r < count; ++r) gate_block[r] = silu(a.z[first + r]);
    }
    int64_t r = 0;
    if (n_state % gemm::kLanes == 0)  // whole vectors (Mamba-1's n = 16): rows interleaved
      for (; r + kStepRows <= count; r += kStepRows)
        state_update_vector_rows<kStepRows>(a, first + r, dt_block + r, gate_block + r);
    for (; r < count; ++r) {
      const int64_t row = first + r;
      if (n_state % gemm::kLanes == 0) {
        state_update_vector_rows<1>(a, row, dt_block + r, gate_block + r);
        continue;
      }
      const int64_t b = row / a.dim, c = row % a.dim;
      const float dt = dt_block[r], xv = a.x[row], du = dt * xv;
      const float* A = a.A + c * n_state;
      const float* B = a.B + (b * a.groups_b + c / per_group_b) * n_state;
      const float* C = a.C + (b * a.groups_c + c / per_group_c) * n_state;
      const float* h = a.state + row * n_state;
      float* hn = a.new_state + row * n_state;
      float y = 0.f;
#pragma omp simd reduction(+ : y)
      for (int64_t i = 0; i < n_state; ++i) {
        const float hi = std::exp(dt * A[i]) * h[i] + du * B[i];
        hn[i] = hi;
        y += hi * C[i];
      }
      y += (a.D ? a.D[c] : 0.f) * xv;
      a.out[row] = a.z ? y * gate_block[r] : y;
    }
  }
}

struct ConvStepArgs {
  const float *x, *state, *weight, *bias;  // state: (b, d, k-1)
  float *out, *new_state;
  int64_t batch, dim, width;
  Activation activation;
};

inline void causal_conv1d_update_rows(const ConvStepArgs& a, int64_t row_begin, int64_t row_end) {
  const int64_t k = a.width, history = k - 1;
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t c = row % a.dim;
    const float* s = a.state + row * history;
    const float* w = a.weight + c * k;
    float acc = a.bias ? a.bias[c] : 0.f;
    for (int64_t j = 0; j < history; ++j) acc += w[j] * s[j];
    a.out[row] = acc + w[history] * a.x[row];
    float* ns = a.new_state + row * history;
    for (int64_t j = 0; j + 1 < history; ++j) ns[j] = s[j + 1];
    if (history > 0) ns[history - 1] = a.x[row];
  }
  // a separate loop over the rows, which vectorises
  activate_span(a.out + row_begin, row_end - row_begin, a.activation);
}

}  // namespace ssmcc
