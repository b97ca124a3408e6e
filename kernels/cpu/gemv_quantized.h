// Matrix-vector products with weights stored small (math: ssmcc/ops/quantized_linear.py):
//
//   y (M x N) = x (M x K) W^T + b,   W[n, k] = weight[n, k] * scale[n, k / g],   g = K / G
//
// ``weight`` (N x K) is int8, bfloat16 or float16, ``scale`` (N x G) float32 (G = 1: one scale
// per output channel). Decode reads every weight once per token, so bytes are time: the weights
// stream in their small form and are widened in registers (int8 -> int32 -> float, bfloat16 by
// a 16-bit shift, float16 by F16C's conversion), as gemv.h streams float32 ones: kQuantizedBlock
// rows of W at a time, every row of x against them, one vector accumulator per (row of W, row of
// x) per group, scaled once per group. The widening makes these products compute-bound where
// float32 ones wait on memory, so the block is 8 rows, not gemv.h's 4: 8 independent FMA chains
// hide the FMA latency (measured on AMD EPYC Zen 5, int8, one thread, weights in L2: 57 G
// weights/s at 8 rows against 33 at 4; from memory 21 against 16). ``dequantize_rows`` widens whole rows to float32 for the
// matrix-matrix products of prefill (done by a float32 GEMM).
#pragma once

#include <cstdint>
#include <cstring>

#include "gemv.h"
#include "small_gemm.h"

namespace ssmcc {

enum class Storage : int { kInt8 = 0, kBFloat16 = 1, kFloat16 = 2 };

constexpr int kQuantizedBlock = 8;

template <typename W>
struct QuantizedGemvArgs {
  const float* x;       // (M, K)
  const W* weight;      // (N, K)
  const float* scale;   // (N, G)
  const float* bias;    // (N,) or null
  float* y;             // (M, N)
  int64_t rows, out_features, in_features, groups;
};

// kLanes consecutive stored weights as float32 lanes: AVX-512 or AVX2 conversions (GCC's generic
// vector conversions of int8 and _Float16 lanes come out element by element), else a loop.
inline gemm::vfloat widen(const int8_t* p) {
#if defined(__AVX512F__)
  return (gemm::vfloat)_mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#elif defined(__AVX2__)
  return (gemm::vfloat)_mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
#else
  gemm::vfloat out;
  for (int i = 0; i < gemm::kLanes; ++i) out[i] = static_cast<float>(p[i]);
  return out;
#endif
}

inline gemm::vfloat widen(const uint16_t* p) {  // bfloat16: the high half of a float32
#if defined(__AVX512F__)
  const __m512i words = _mm512_slli_epi32(
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16);
  return (gemm::vfloat)_mm512_castsi512_ps(words);
#elif defined(__AVX2__)
  const __m256i words = _mm256_slli_epi32(
      _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16);
  return (gemm::vfloat)_mm256_castsi256_ps(words);
#else
  gemm::vfloat out;
  for (int i = 0; i < gemm::kLanes; ++i) {
    const uint32_t word = static_cast<uint32_t>(p[i]) << 16;
    std::memcpy(&out[i], &word, sizeof(float));
  }
  return out;
#endif
}

inline gemm::vfloat widen(const _Float16* p) {
#if defined(__AVX512F__)
  return (gemm::vfloat)_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#elif defined(__F16C__) && defined(__AVX2__)
  return (gemm::vfloat)_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
  gemm::vfloat out;
  for (int i = 0; i < gemm::kLanes; ++i) out[i] = static_cast<float>(p[i]);
  return out;
#endif
}

inline float widen_one(int8_t w) { return static_cast<float>(w); }
inline float widen_one(_Float16 w) { return static_cast<float>(w); }
inline float widen_one(uint16_t w) {
  const uint32_t word = static_cast<uint32_t>(w) << 16;
  float out;
  std::memcpy(&out, &word, sizeof out);
  return out;
}

// Outputs n0 .. n0 + R - 1 of row m of x: R rows of W streamed together, the next R rows
// prefetched meanwhile (see kPrefetchLine).
template <int R, typename W>
inline void quantized_gemv_block(const QuantizedGemvArgs<W>& a, int64_t n0, int64_t m) {
  const int64_t K = a.in_features, G = a.groups, g = K / G;
  const int64_t full = g - g % gemm::kLanes;
  constexpr int64_t kLine = kPrefetchLine / sizeof(W);  // weights a cache line
  const float* x = a.x + m * K;
  gemm::vfloat total[R] = {};
  float tail[R] = {};
  for (int64_t group = 0; group < G; ++group) {
    const int64_t k0 = group * g;
    const W* w = a.weight + n0 * K + k0;
    gemm::vfloat acc[R] = {};
    for (int64_t k = 0; k < full; k += gemm::kLanes) {
      const gemm::vfloat xv = gemm::load(x + k0 + k);
      if (k % kLine == 0)
        for (int r = 0; r < R; ++r) prefetch(w + (R + r) * K + k);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r] += widen(w + r * K + k) * xv;
    }
    for (int r = 0; r < R; ++r) {
      const float s = a.scale[(n0 + r) * G + group];
      total[r] += acc[r] * s;
      float rest = 0.f;
      for (int64_t k = full; k < g; ++k) rest += widen_one(w[r * K + k]) * x[k0 + k];
      tail[r] += rest * s;
    }
  }
  for (int r = 0; r < R; ++r)
    a.y[m * a.out_features + n0 + r] =
        lane_sum(total[r]) + tail[r] + (a.bias ? a.bias[n0 + r] : 0.f);
}

// Output columns [n_begin, n_end) of every row of x.
template <typename W>
void quantized_gemv_rows(const QuantizedGemvArgs<W>& a, int64_t n_begin, int64_t n_end) {
  int64_t n0 = n_begin;
  for (; n0 + kQuantizedBlock <= n_end; n0 += kQuantizedBlock)
    for (int64_t m = 0; m < a.rows; ++m) quantized_gemv_block<kQuantizedBlock>(a, n0, m);
  for (; n0 < n_end; ++n0)
    for (int64_t m = 0; m < a.rows; ++m) quantized_gemv_block<1>(a, n0, m);
}

// Rows [n_begin, n_end) of W as float32 into ``out`` (N x K).
template <typename W>
void dequantize_rows(const W* weight, const float* scale, float* out, int64_t in_features,
                     int64_t groups, int64_t n_begin, int64_t n_end) {
  const int64_t g = in_features / groups;
  for (int64_t n = n_begin; n < n_end; ++n)
    for (int64_t group = 0; group < groups; ++group) {
      const float s = scale[n * groups + group];
      const W* w = weight + n * in_features + group * g;
      float* o = out + n * in_features + group * g;
      int64_t k = 0;
      for (; k + gemm::kLanes <= g; k += gemm::kLanes) {
        const gemm::vfloat v = widen(w + k) * s;
        std::memcpy(o + k, &v, sizeof v);
      }
      for (; k < g; ++k) o[k] = widen_one(w[k]) * s;
    }
}

}  // namespace ssmcc
