// ssd_mixer / ssd_mixer_step (math: ssmcc/ops/ssd_mixer.py): a Mamba-2 mixer between its two
// projections, reading the input projection's output P (b, l, w) in place. With h heads of p,
// d = h p, g groups of n, c = d + 2 g n conv channels and a conv of width k:
//
//   phase 1  xBC = act(bias + sum_j w[:, j] xs[t + j])   channels-last: each position's c channels
//            are contiguous in P (at xbc_offset) and in the scratch xbc (b, l, c), so the
//            channel loop vectorises; xs = (conv_state, P[..., xBC]); the conv state out is the
//            last k-1 entries of xs (mixer_conv_rows over (batch, block of positions))
//   phase 2  ssd_scan with x, B, C = views of xbc (token stride c) and dt a view of P (stride w),
//            writing y (b, l, d); chunked or sequential as ssd_scan (the bindings run it)
//   phase 3  y = rmsnorm_gated(y, z = view of P at z_offset) in place (mixer_norm_rows)
//
// ssd_mixer_step is the same at one position: phase 1 the conv update (mixer_conv_step_rows over
// the batch), phase 2 ssd_state_update, phase 3 the norm. Nothing is copied out of P; the only
// scratch is xbc (b, l, c) (a step: (b, c)). Sizes satisfy check_ssd_mixer (contracts.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ssd_kernels.h"
#include "tuning.h"

namespace ssmcc {

struct MixerArgs {
  const float* proj;                          // (b, l, w); a step: (b, w)
  const float *conv_weight, *conv_bias;       // (c, k); (c,) or null
  const float* conv_weight_t;                 // (k, c): the weight transposed (sequences only)
  const float *A, *D, *dt_bias, *norm_weight;  // (h,), (h, p) or null, (h,) or null, (d,)
  const float *conv_state, *ssm_state;        // (b, c, k-1), (b, h, p, n); null: zeros
  float *y, *conv_state_out, *ssm_state_out;  // (b, l, d), (b, c, k-1), (b, h, p, n)
  float* xbc;                                 // scratch (b, l, c)
  int64_t batch, length, width, heads, head_dim, groups, dstate, kernel;
  int64_t z_offset, xbc_offset, dt_offset, norm_group_size;  // z_offset < 0: no gate
  bool silu, dt_softplus, norm_before_gate;
  float dt_min, dt_max, eps;

  int64_t inner() const { return heads * head_dim; }
  int64_t channels() const { return inner() + 2 * groups * dstate; }
};

// The conv weight (c, k) as (k, c) for the channels-last sequence conv; nothing for a step.
inline void transpose_conv_weight(const float* weight, float* weight_t, int64_t channels,
                                  int64_t kernel, bool step) {
  if (step) return;
  for (int64_t ch = 0; ch < channels; ++ch)
    for (int64_t j = 0; j < kernel; ++j) weight_t[j * channels + ch] = weight[ch * kernel + j];
}

// Phase 1 over rows (batch, block of kMixerConvBlock positions).
inline void mixer_conv_rows(const MixerArgs& a, int64_t row_begin, int64_t row_end) {
  const int64_t c = a.channels(), k = a.kernel, history = k - 1;
  const int64_t blocks = (a.length + tuning::kMixerConvBlock - 1) / tuning::kMixerConvBlock;
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t b = row / blocks, first = (row % blocks) * tuning::kMixerConvBlock;
    const int64_t last = std::min(first + tuning::kMixerConvBlock, a.length);
    for (int64_t t = first; t < last; ++t) {
      float* out = a.xbc + (b * a.length + t) * c;
      for (int64_t ch = 0; ch < c; ++ch) out[ch] = a.conv_bias ? a.conv_bias[ch] : 0.f;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t tau = t + j - history;  // xs[t + j] is position tau of the input
        const float* w = a.conv_weight_t + j * c;
        if (tau >= 0) {
          const float* x = a.proj + (b * a.length + tau) * a.width + a.xbc_offset;
#pragma omp simd
          for (int64_t ch = 0; ch < c; ++ch) out[ch] += w[ch] * x[ch];
        } else if (a.conv_state) {
          const float* s = a.conv_state + b * c * history + history + tau;  // [ch, history + tau]
          for (int64_t ch = 0; ch < c; ++ch) out[ch] += w[ch] * s[ch * history];
        }
      }
      if (a.silu) {
#pragma omp simd
        for (int64_t ch = 0; ch < c; ++ch) out[ch] = out[ch] / (1.f + std::exp(-out[ch]));
      }
    }
  }
}

// The conv state after the last position: the last k-1 entries of xs, per (batch, channel).
inline void mixer_conv_state_out(const MixerArgs& a) {
  const int64_t c = a.channels(), history = a.kernel - 1;
  for (int64_t b = 0; b < a.batch; ++b)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t j = 0; j < history; ++j) {
        const int64_t tau = a.length + j - history;  // xs[length + j]
        float v = 0.f;
        if (tau >= 0)
          v = a.proj[(b * a.length + tau) * a.width + a.xbc_offset + ch];
        else if (a.conv_state)
          v = a.conv_state[(b * c + ch) * history + history + tau];
        a.conv_state_out[(b * c + ch) * history + j] = v;
      }
}

// Phase 2's arguments: the scan (or, for a step, the state update: ``length`` 1, tokens = rows).
inline SsdArgs mixer_scan_args(const MixerArgs& a) {
  const int64_t c = a.channels(), d = a.inner(), gn = a.groups * a.dstate;
  SsdArgs s{a.xbc,          a.proj + a.dt_offset, a.A,        a.xbc + d,      a.xbc + d + gn,
            a.D,            nullptr,              a.dt_bias,  a.ssm_state,    a.y,
            a.ssm_state_out, a.batch,             a.length,   a.heads,        a.head_dim,
            a.groups,       a.dstate,             a.dt_softplus, a.dt_min,    a.dt_max,
            c,              a.width,              c,          c,              0,
            d};
  return with_strides(s);
}

// Phase 3 over rows (batch * length): y = rmsnorm_gated(y, z) in place.
inline void mixer_norm_rows(const MixerArgs& a, int64_t row_begin, int64_t row_end) {
  NormArgs n{a.y,   a.z_offset >= 0 ? a.proj + a.z_offset : nullptr,
             a.norm_weight, a.y, a.batch * a.length, a.inner(), a.norm_group_size, a.eps,
             a.norm_before_gate, a.width};
  rmsnorm_gated_rows(n, row_begin, row_end);
}

// Step phase 1 over rows (batch): the conv update of every channel, into xbc (b, c). Reads the
// weight as (c, k): k multiply-adds a channel do not need a transposed copy.
inline void mixer_conv_step_rows(const MixerArgs& a, int64_t row_begin, int64_t row_end) {
  const int64_t c = a.channels(), k = a.kernel, history = k - 1;
  for (int64_t b = row_begin; b < row_end; ++b) {
    const float* x = a.proj + b * a.width + a.xbc_offset;
    const float* state = a.conv_state + b * c * history;
    float* next = a.conv_state_out + b * c * history;
    float* out = a.xbc + b * c;
    for (int64_t ch = 0; ch < c; ++ch) {
      const float* s = state + ch * history;
      const float* w = a.conv_weight + ch * k;
      float acc = (a.conv_bias ? a.conv_bias[ch] : 0.f) + w[history] * x[ch];
      for (int64_t j = 0; j < history; ++j) acc += w[j] * s[j];
      out[ch] = acc;
      float* n = next + ch * history;
      for (int64_t j = 0; j + 1 < history; ++j) n[j] = s[j + 1];
      if (history > 0) n[history - 1] = x[ch];
    }
    if (a.silu) {
#pragma omp simd
      for (int64_t ch = 0; ch < c; ++ch) out[ch] = out[ch] / (1.f + std::exp(-out[ch]));
    }
  }
}

}  // namespace ssmcc
