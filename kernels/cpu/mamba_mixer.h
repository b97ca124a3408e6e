// mamba_mixer / mamba_mixer_step (math: ssmcc/ops/mamba_mixer.py): a Mamba-1 mixer between its
// two projections, token-major throughout, reading the input projection's output P (b, l, w) in
// place. With d channels, a conv of width k, dt rank R, state n and E = R + 2n:
//
//   phase 1  xc = act(conv(P[..., x]))                  (b, l, d)  conv_channels_last.h
//   phase 2  dbc = xc x_proj^T (b, l, E), split into dt_r, B, C (FalconMamba: each RMS-normed),
//            dt = dt_r dt_proj^T (b, l, d)               small_gemm.h, over blocks of positions
//   phase 3  the selective scan over (batch, block of kLanes channels): the block's state
//            (n vectors of channels) stays in registers across positions, B_t and C_t are
//            broadcast scalars (one B, C for every channel), and y_t goes out token-major:
//              dt = softplus(dt_t + dt_bias); h_i = exp(dt A[:, i]) h_i + dt x_t B_t[i]
//              y_t = sum_i C_t[i] h_i + D x_t;   y_t *= silu(z_t)
//
// The step form: the conv update, x_proj and dt_proj as matrix-vector products (gemv.h) and one
// selective_state_update (ssm_kernels.h). Scratch: xc, dbc, dt. Sizes satisfy
// check_mamba_mixer (contracts.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "conv_channels_last.h"
#include "gemv.h"
#include "small_gemm.h"
#include "ssm_kernels.h"
#include "tuning.h"

namespace ssmcc {

struct MambaMixerArgs {
  const float* proj;                           // (b, l, w); a step: (b, w)
  const float *conv_weight, *conv_weight_t;    // (d, k); (k, d) (sequences)
  const float *conv_bias;                      // (d,) or null
  const float *x_proj, *x_proj_t;              // (E, d); (d, E) (sequences)
  const float *dt_proj, *dt_proj_t;            // (d, R); (R, d) (sequences)
  const float *A, *A_t;                        // (d, n); (n, d) (sequences)
  const float *D, *dt_bias;                    // (d,) or null
  const float *conv_state, *ssm_state;         // (b, d, k-1), (b, d, n); null: zeros
  float *y, *conv_state_out, *ssm_state_out;   // (b, l, d), (b, d, k-1), (b, d, n)
  float *xc, *dbc, *dt;                        // scratch (b, l, d), (b, l, E), (b, l, d)
  int64_t batch, length, width, x_offset, z_offset;  // z_offset < 0: no gate
  int64_t channels, kernel, rank, dstate;
  bool silu, softplus, rms;
  float rms_eps;

  int64_t projected() const { return rank + 2 * dstate; }
  int64_t tokens() const { return batch * length; }
};

inline ConvChannelsLast mamba_mixer_conv(const MambaMixerArgs& a) {
  return {a.proj,      a.width,      a.x_offset, a.conv_weight, a.conv_weight_t,
          a.conv_bias, a.conv_state, a.xc,       a.conv_state_out, a.batch,
          a.length,    a.channels,   a.kernel,   a.silu};
}

// v /= sqrt(mean(v^2) + eps) over ``size`` floats.
inline void rms_in_place(float* v, int64_t size, float eps) {
  float squares = 0.f;
  for (int64_t i = 0; i < size; ++i) squares += v[i] * v[i];
  const float scale = 1.f / std::sqrt(squares / static_cast<float>(size) + eps);
  for (int64_t i = 0; i < size; ++i) v[i] *= scale;
}

// Phase 2 over rows = blocks of kMixerConvBlock positions (of all batch rows together).
inline void mamba_projection_rows(const MambaMixerArgs& a, int64_t row_begin, int64_t row_end) {
  const int64_t d = a.channels, E = a.projected(), R = a.rank, n = a.dstate;
  const int64_t block = tuning::kMixerConvBlock, k_block = tuning::kProjectionDepth;
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t first = row * block, count = std::min(block, a.tokens() - first);
    const float* xc = a.xc + first * d;
    float* dbc = a.dbc + first * E;
    for (int64_t k0 = 0; k0 < d; k0 += k_block)  // depth blocks keep x_proj's panel in cache
      gemm::matmul(count, E, std::min(k_block, d - k0), xc + k0, d, 1, a.x_proj_t + k0 * E, E,
                   dbc, E, k0 > 0);
    if (a.rms)
      for (int64_t t = 0; t < count; ++t) {
        rms_in_place(dbc + t * E, R, a.rms_eps);
        rms_in_place(dbc + t * E + R, n, a.rms_eps);
        rms_in_place(dbc + t * E + R + n, n, a.rms_eps);
      }
    gemm::matmul(count, d, R, dbc, E, 1, a.dt_proj_t, d, a.dt + first * d, d, false);
  }
}

// Phase 3 for one block of ``lanes`` channels starting at c0 of batch row b. kFull: lanes is
// gemm::kLanes (the loops have a fixed trip count and vectorise without remainders).
template <bool kFull>
inline void mamba_scan_block(const MambaMixerArgs& a, int64_t b, int64_t c0, int rest) {
  constexpr int kL = gemm::kLanes;
  const int lanes = kFull ? kL : rest;
  const int64_t d = a.channels, n = a.dstate, E = a.projected(), R = a.rank;
  std::vector<float> h_store(n * kL), A_store(n * kL);
  float* h = h_store.data();
  float* A = A_store.data();
  float bias[kL] = {}, D[kL] = {}, dt[kL], u[kL], y[kL];
  for (int64_t i = 0; i < n; ++i)
    for (int l = 0; l < lanes; ++l) {
      A[i * kL + l] = a.A_t[i * d + c0 + l];
      h[i * kL + l] = a.ssm_state ? a.ssm_state[(b * d + c0 + l) * n + i] : 0.f;
    }
  for (int l = 0; l < lanes; ++l) {
    bias[l] = a.dt_bias ? a.dt_bias[c0 + l] : 0.f;
    D[l] = a.D ? a.D[c0 + l] : 0.f;
  }
  for (int64_t t = 0; t < a.length; ++t) {
    const int64_t token = b * a.length + t;
    const float* x = a.xc + token * d + c0;
    const float* dt_in = a.dt + token * d + c0;
    const float* B = a.dbc + token * E + R;
    const float* C = B + n;
#pragma omp simd
    for (int l = 0; l < lanes; ++l) {
      const float v = dt_in[l] + bias[l];
      dt[l] = a.softplus ? softplus_vectorizable(v) : v;
      u[l] = x[l];
      y[l] = 0.f;
    }
    for (int64_t i = 0; i < n; ++i) {
      const float Bi = B[i], Ci = C[i];
      float* hi = h + i * kL;
      const float* Ai = A + i * kL;
#pragma omp simd
      for (int l = 0; l < lanes; ++l) {
        hi[l] = std::exp(dt[l] * Ai[l]) * hi[l] + dt[l] * u[l] * Bi;
        y[l] += hi[l] * Ci;
      }
    }
    float* out = a.y + token * d + c0;
    if (a.z_offset >= 0) {
      const float* z = a.proj + token * a.width + a.z_offset + c0;
#pragma omp simd
      for (int l = 0; l < lanes; ++l) out[l] = (y[l] + D[l] * u[l]) * silu(z[l]);
    } else {
#pragma omp simd
      for (int l = 0; l < lanes; ++l) out[l] = y[l] + D[l] * u[l];
    }
  }
  for (int64_t i = 0; i < n; ++i)
    for (int l = 0; l < lanes; ++l) a.ssm_state_out[(b * d + c0 + l) * n + i] = h[i * kL + l];
}

inline int64_t mamba_channel_blocks(const MambaMixerArgs& a) {
  return (a.channels + gemm::kLanes - 1) / gemm::kLanes;
}

// Phase 3 over rows (batch, block of kLanes channels).
inline void mamba_scan_rows(const MambaMixerArgs& a, int64_t row_begin, int64_t row_end) {
  const int64_t blocks = mamba_channel_blocks(a);
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t b = row / blocks, c0 = (row % blocks) * gemm::kLanes;
    const int rest = static_cast<int>(std::min<int64_t>(gemm::kLanes, a.channels - c0));
    if (rest == gemm::kLanes)
      mamba_scan_block<true>(a, b, c0, rest);
    else
      mamba_scan_block<false>(a, b, c0, rest);
  }
}

// The step (length 1) after its conv update (xc holds (b, d)): the projections as
// matrix-vector products, then one state update. ``rows`` scratch: B, C (b, n) and z (b, d).
inline void mamba_step_rows(const MambaMixerArgs& a, float* B, float* C, float* z) {
  const int64_t d = a.channels, E = a.projected(), R = a.rank, n = a.dstate;
  const GemvArgs project{a.xc, a.x_proj, nullptr, a.dbc, a.batch, E, d};
  gemv_rows(project, 0, E);
  for (int64_t b = 0; b < a.batch; ++b) {
    float* row = a.dbc + b * E;
    if (a.rms) {
      rms_in_place(row, R, a.rms_eps);
      rms_in_place(row + R, n, a.rms_eps);
      rms_in_place(row + R + n, n, a.rms_eps);
    }
    const GemvArgs widen{row, a.dt_proj, nullptr, a.dt + b * d, 1, d, R};
    gemv_rows(widen, 0, d);
    std::copy(row + R, row + R + n, B + b * n);
    std::copy(row + R + n, row + R + 2 * n, C + b * n);
    if (a.z_offset >= 0) {
      const float* gate = a.proj + b * a.width + a.z_offset;
      std::copy(gate, gate + d, z + b * d);
    }
  }
  const StepArgs step{a.ssm_state, a.xc, a.dt, a.A, B, C, a.D, a.z_offset >= 0 ? z : nullptr,
                      a.dt_bias, a.y, a.ssm_state_out, a.batch, d, 1, 1, n, a.softplus};
  selective_state_update_rows(step, 0, a.batch * d);
}

}  // namespace ssmcc
