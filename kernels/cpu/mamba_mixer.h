// mamba_mixer / mamba_mixer_step (math: ssmcc/ops/mamba_mixer.py): a Mamba-1 mixer between its
// two projections, token-major throughout, reading the input projection's output P (b, l, w) in
// place. With d channels, a conv of width k, dt rank R, state n and E = R + 2n:
//
//   phase 1  xc = act(conv(P[..., x]))                  (b, l, d)  conv_channels_last.h
//   phase 2  dbc = xc x_proj^T (b, l, E), split into dt_r, B, C (FalconMamba: each RMS-normed),
//            dt = dt_r dt_proj^T (b, l, d)               small_gemm.h, over blocks of positions
//   phase 3  the selective scan over (batch, group of blocks of kLanes channels), positions in
//            the outer loop: each block's state (n vectors of channels) stays in L1, B_t and C_t
//            are broadcast scalars (one B, C for every channel), and y_t goes out token-major:
//              dt = softplus(dt_t + dt_bias); h_i = exp(dt A[:, i]) h_i + dt x_t B_t[i]
//              y_t = sum_i C_t[i] h_i + D x_t;   y_t *= silu(z_t)
//
// x_proj and dt_proj may be stored small (mixer_weight.h): the step's products read them so, the
// sequence path's GEMMs read the float32 transposes the caller widens once per call.
//
// The step form: the conv update, x_proj and dt_proj as matrix-vector products (mixer_weight.h)
// and one selective_state_update (ssm_kernels.h), phases split over threads (MambaStep below).
// Scratch: xc, dbc, dt. Sizes satisfy check_mamba_mixer (contracts.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "conv_channels_last.h"
#include "mixer_weight.h"
#include "small_gemm.h"
#include "ssm_kernels.h"
#include "tuning.h"
#include "vector_math.h"

namespace ssmcc {

struct MambaMixerArgs {
  const float* proj;                           // (b, l, w); a step: (b, w)
  const float *conv_weight, *conv_weight_t;    // (d, k); (k, d) (sequences)
  const float *conv_bias;                      // (d,) or null
  MixerWeight x_proj;                          // (E, d)
  const float* x_proj_t;                       // (d, E) float32 (sequences)
  MixerWeight dt_proj;                         // (d, R)
  const float* dt_proj_t;                      // (R, d) float32 (sequences)
  const float *A, *A_t;                        // (d, n); (n, d) (sequences)
  const float *D, *dt_bias;                    // (d,) or null
  const float *conv_state, *ssm_state;         // (b, d, k-1), (b, d, n); null: zeros
  float *y, *conv_state_out, *ssm_state_out;   // (b, l, d), (b, d, k-1), (b, d, n)
  float *xc, *dbc, *dt;                        // scratch (b, l, d), (b, l, E), (b, l, d)
  int64_t batch, length, width, x_offset, z_offset;  // z_offset < 0: no gate
  int64_t channels, kernel, rank, dstate;
  Activation activation;  // the conv's
  bool softplus, rms;
  float rms_eps;

  int64_t projected() const { return rank + 2 * dstate; }
  int64_t tokens() const { return batch * length; }
};

inline ConvChannelsLast mamba_mixer_conv(const MambaMixerArgs& a) {
  return {a.proj,      a.width,      a.x_offset, a.conv_weight, a.conv_weight_t,
          a.conv_bias, a.conv_state, a.xc,       a.conv_state_out, a.batch,
          a.length,    a.channels,   a.kernel,   a.activation};
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

// Phase 3 over rows (batch, group of kScanGroup blocks of gemm::kLanes channels): positions in
// the outer loop and the group's blocks inside, so every position reads and writes whole
// contiguous runs of its rows (x, dt, z, y), while the group's state (n vectors a block) stays
// in L1. A last, partial block computes on zero lanes and stores only its own.
inline int64_t mamba_scan_groups(const MambaMixerArgs& a) {
  const int64_t blocks = (a.channels + gemm::kLanes - 1) / gemm::kLanes;
  return (blocks + tuning::kScanGroup - 1) / tuning::kScanGroup;
}

inline void mamba_scan_rows(const MambaMixerArgs& a, int64_t row_begin, int64_t row_end) {
  using gemm::vfloat;
  constexpr int64_t kL = gemm::kLanes;
  const int64_t d = a.channels, n = a.dstate, E = a.projected(), R = a.rank;
  const int64_t groups = mamba_scan_groups(a);
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t b = row / groups;
    const int64_t first = (row % groups) * tuning::kScanGroup * kL;
    const int64_t last = std::min(d, first + tuning::kScanGroup * kL);
    const int64_t count = (last - first + kL - 1) / kL;
    const auto lanes_of = [&](int64_t block) { return std::min(kL, last - first - block * kL); };
    const auto load = [](const float* p, int64_t lanes) {
      vfloat v = {};
      if (lanes == kL)
        v = gemm::load(p);
      else
        std::memcpy(&v, p, lanes * sizeof(float));
      return v;
    };
    std::vector<vfloat> h(count * n), A(count * n), bias(count), D(count);
    for (int64_t block = 0; block < count; ++block) {
      const int64_t c0 = first + block * kL;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t l = 0; l < lanes_of(block); ++l) {
          A[block * n + i][l] = a.A_t[i * d + c0 + l];
          h[block * n + i][l] = a.ssm_state ? a.ssm_state[(b * d + c0 + l) * n + i] : 0.f;
        }
      bias[block] = a.dt_bias ? load(a.dt_bias + c0, lanes_of(block)) : vfloat{};
      D[block] = a.D ? load(a.D + c0, lanes_of(block)) : vfloat{};
    }
    for (int64_t t = 0; t < a.length; ++t) {
      const int64_t token = b * a.length + t;
      const float* B = a.dbc + token * E + R;
      const float* C = B + n;
      for (int64_t block = 0; block < count; ++block) {
        const int64_t c0 = first + block * kL, lanes = lanes_of(block);
        vfloat dt = load(a.dt + token * d + c0, lanes) + bias[block];
        if (a.softplus) dt = softplus_vector(dt);
        const vfloat u = load(a.xc + token * d + c0, lanes), du = dt * u;
        // the gate before the state loop: its exp and division overlap with that loop's chain
        // (after it, they waited for it: 28 vs 21 ms a layer at mamba-130m's size)
        const vfloat gate = a.z_offset >= 0
                                ? silu_vector(load(a.proj + token * a.width + a.z_offset + c0, lanes))
                                : vfloat{} + 1.0f;
        vfloat* hb = h.data() + block * n;
        const vfloat* Ab = A.data() + block * n;
        vfloat y = {};
        for (int64_t i = 0; i < n; ++i) {
          hb[i] = exp_vector(dt * Ab[i]) * hb[i] + du * B[i];
          y += hb[i] * C[i];
        }
        const vfloat out = (y + D[block] * u) * gate;
        if (lanes == kL)
          gemm::store(a.y + token * d + c0, out);
        else
          std::memcpy(a.y + token * d + c0, &out, lanes * sizeof(float));
      }
    }
    for (int64_t block = 0; block < count; ++block) {
      const int64_t c0 = first + block * kL;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t l = 0; l < lanes_of(block); ++l)
          a.ssm_state_out[(b * d + c0 + l) * n + i] = h[block * n + i][l];
    }
  }
}

// The step (length 1) after its conv update (xc holds (b, d)), in three phases so that the two
// parallel ones split over threads (a decode token reads x_proj and dt_proj from memory: ~0.8 MB
// a layer at mamba-130m's sizes, which one thread streams at half the speed of two):
//   mamba_step_project_rows  dbc = xc x_proj^T, output features [e_begin, e_end)   (parallel)
//   mamba_step_split         FalconMamba's RMS norms of dt_r, B, C; B, C, z gathered   (serial)
//   mamba_step_channel_rows  dt = dt_r dt_proj^T and the state update, rows of (b, d)  (parallel)
// ``MambaStep`` scratch: B, C (b, n) and z (b, d).
struct MambaStep {
  const MambaMixerArgs* a;
  float *B, *C, *z;
};

inline void mamba_step_project_rows(const MambaStep& s, int64_t e_begin, int64_t e_end) {
  const MambaMixerArgs& a = *s.a;
  mixer_weight_gemv_rows(a.x_proj, a.xc, a.dbc, a.batch, a.projected(), a.channels, e_begin,
                         e_end);
}

inline void mamba_step_split(const MambaStep& s) {
  const MambaMixerArgs& a = *s.a;
  const int64_t d = a.channels, E = a.projected(), R = a.rank, n = a.dstate;
  for (int64_t b = 0; b < a.batch; ++b) {
    float* row = a.dbc + b * E;
    if (a.rms) {
      rms_in_place(row, R, a.rms_eps);
      rms_in_place(row + R, n, a.rms_eps);
      rms_in_place(row + R + n, n, a.rms_eps);
    }
    std::copy(row + R, row + R + n, s.B + b * n);
    std::copy(row + R + n, row + R + 2 * n, s.C + b * n);
    if (a.z_offset >= 0) {
      const float* gate = a.proj + b * a.width + a.z_offset;
      std::copy(gate, gate + d, s.z + b * d);
    }
  }
}

inline void mamba_step_channel_rows(const MambaStep& s, int64_t row_begin, int64_t row_end) {
  const MambaMixerArgs& a = *s.a;
  const int64_t d = a.channels, E = a.projected(), R = a.rank;
  for (int64_t row = row_begin; row < row_end;) {
    const int64_t b = row / d, c0 = row % d, c1 = std::min(d, c0 + (row_end - row));
    mixer_weight_gemv_rows(a.dt_proj, a.dbc + b * E, a.dt + b * d, 1, d, R, c0, c1);
    row += c1 - c0;
  }
  const StepArgs step{a.ssm_state, a.xc, a.dt, a.A, s.B, s.C, a.D,
                      a.z_offset >= 0 ? s.z : nullptr, a.dt_bias, a.y, a.ssm_state_out,
                      a.batch, d, 1, 1, a.dstate, a.softplus};
  selective_state_update_rows(step, row_begin, row_end);
}

}  // namespace ssmcc
