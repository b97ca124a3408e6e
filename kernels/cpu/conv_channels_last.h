// The depthwise causal conv of the fused mixers, channels-last (math: ssmcc/ops/causal_conv1d.py):
// the input is a token-major tensor (b, l, width) read in place at channels [offset, offset + c)
// (a slice of a projection's output), the output is token-major (b, l, c). Each position's
// channels are contiguous on both sides, so the channel loop vectorises:
//
//   out[t, ch] = act(bias[ch] + sum_j w[ch, j] xs[t + j, ch]),   xs = (state (k-1 entries), in)
//
// (act: one of activations.h), and the state after the last position is the last k-1 entries of
// xs. The step form reads one position per batch row (in (b, width)) and shifts the state by one.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "activations.h"
#include "tuning.h"

namespace ssmcc {

struct ConvChannelsLast {
  const float* in;                     // (b, l, width), or a step's (b, width)
  int64_t width, offset;               // row stride of in; first channel read
  const float *weight, *weight_t;      // (c, k); (k, c) transposed (sequences only)
  const float *bias, *state;           // (c,) or null; (b, c, k-1) or null (zeros)
  float *out, *state_out;              // (b, l, c); (b, c, k-1)
  int64_t batch, length, channels, kernel;
  Activation activation;
};

inline int64_t conv_blocks(int64_t length) {
  return (length + tuning::kMixerConvBlock - 1) / tuning::kMixerConvBlock;
}

// The weight (c, k) as (k, c) for the sequence form; nothing for a step.
inline void transpose_conv_weight(const float* weight, float* weight_t, int64_t channels,
                                  int64_t kernel, bool step) {
  if (step) return;
  for (int64_t ch = 0; ch < channels; ++ch)
    for (int64_t j = 0; j < kernel; ++j) weight_t[j * channels + ch] = weight[ch * kernel + j];
}

// Sequence form over rows (batch, block of kMixerConvBlock positions).
inline void conv_channels_last_rows(const ConvChannelsLast& a, int64_t row_begin,
                                    int64_t row_end) {
  const int64_t c = a.channels, k = a.kernel, history = k - 1, blocks = conv_blocks(a.length);
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t b = row / blocks, first = (row % blocks) * tuning::kMixerConvBlock;
    const int64_t last = std::min(first + tuning::kMixerConvBlock, a.length);
    for (int64_t t = first; t < last; ++t) {
      float* out = a.out + (b * a.length + t) * c;
      for (int64_t ch = 0; ch < c; ++ch) out[ch] = a.bias ? a.bias[ch] : 0.f;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t tau = t + j - history;  // xs[t + j] is position tau of the input
        const float* w = a.weight_t + j * c;
        if (tau >= 0) {
          const float* x = a.in + (b * a.length + tau) * a.width + a.offset;
#pragma omp simd
          for (int64_t ch = 0; ch < c; ++ch) out[ch] += w[ch] * x[ch];
        } else if (a.state) {
          const float* s = a.state + b * c * history + history + tau;  // [ch, history + tau]
          for (int64_t ch = 0; ch < c; ++ch) out[ch] += w[ch] * s[ch * history];
        }
      }
      activate_span(out, c, a.activation);
    }
  }
}

// The state after the sequence: the last k-1 entries of xs, per (batch, channel).
inline void conv_channels_last_state_out(const ConvChannelsLast& a) {
  const int64_t c = a.channels, history = a.kernel - 1;
  for (int64_t b = 0; b < a.batch; ++b)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t j = 0; j < history; ++j) {
        const int64_t tau = a.length + j - history;  // xs[length + j]
        float v = 0.f;
        if (tau >= 0)
          v = a.in[(b * a.length + tau) * a.width + a.offset + ch];
        else if (a.state)
          v = a.state[(b * c + ch) * history + history + tau];
        a.state_out[(b * c + ch) * history + j] = v;
      }
}

// Step form over rows (batch): one position from ``state`` (required), into out (b, c). Reads
// the weight as (c, k): k multiply-adds a channel need no transposed copy.
inline void conv_channels_last_step_rows(const ConvChannelsLast& a, int64_t row_begin,
                                         int64_t row_end) {
  const int64_t c = a.channels, k = a.kernel, history = k - 1;
  for (int64_t b = row_begin; b < row_end; ++b) {
    const float* x = a.in + b * a.width + a.offset;
    const float* state = a.state + b * c * history;
    float* next = a.state_out + b * c * history;
    float* out = a.out + b * c;
    for (int64_t ch = 0; ch < c; ++ch) {
      const float* s = state + ch * history;
      const float* w = a.weight + ch * k;
      float acc = (a.bias ? a.bias[ch] : 0.f) + w[history] * x[ch];
      for (int64_t j = 0; j < history; ++j) acc += w[j] * s[j];
      out[ch] = acc;
      float* n = next + ch * history;
      for (int64_t j = 0; j + 1 < history; ++j) n[j] = s[j + 1];
      if (history > 0) n[history - 1] = x[ch];
    }
    activate_span(out, c, a.activation);
  }
}

}  // namespace ssmcc
