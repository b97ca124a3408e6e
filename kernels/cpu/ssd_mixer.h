// ssd_mixer / ssd_mixer_step (math: ssmcc/ops/ssd_mixer.py): a Mamba-2 mixer between its two
// projections, reading the input projection's output P (b, l, w) in place. With h heads of p,
// d = h p, g groups of n, c = d + 2 g n conv channels and a conv of width k:
//
//   phase 1  xBC = act(bias + sum_j w[:, j] xs[t + j])   channels-last: each position's c channels
//            are contiguous in P (at xbc_offset) and in the scratch xbc (b, l, c), so the
//            channel loop vectorises; xs = (conv_state, P[..., xBC]); the conv state out is the
//            last k-1 entries of xs (conv_channels_last.h over (batch, block of positions))
//   phase 2  ssd_scan with x, B, C = views of xbc (token stride c) and dt a view of P (stride w),
//            writing y (b, l, d); chunked or sequential as ssd_scan (the bindings run it)
//   phase 3  y = rmsnorm_gated(y, z = view of P at z_offset) in place (mixer_norm_rows)
//
// ssd_mixer_step is the same at one position: phase 1 the conv update (over the batch), phase 2
// ssd_state_update, phase 3 the norm. Nothing is copied out of P; the only
// scratch is xbc (b, l, c) (a step: (b, c)). Sizes satisfy check_ssd_mixer (contracts.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "conv_channels_last.h"
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
  Activation activation;  // the conv's
  bool dt_softplus, norm_before_gate;
  float dt_min, dt_max, eps;

  int64_t inner() const { return heads * head_dim; }
  int64_t channels() const { return inner() + 2 * groups * dstate; }
};

// The conv of phase 1 (conv_channels_last.h): xBC's channels of P into xbc.
inline ConvChannelsLast mixer_conv(const MixerArgs& a) {
  return {a.proj,      a.width,          a.xbc_offset, a.conv_weight, a.conv_weight_t,
          a.conv_bias, a.conv_state,     a.xbc,        a.conv_state_out, a.batch,
          a.length,    a.channels(),     a.kernel,     a.activation};
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

}  // namespace ssmcc
