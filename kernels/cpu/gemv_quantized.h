// Matrix-vector products with weights stored small (math: ssmcc/ops/quantized_linear.py):
//
//   y (M x N) = x (M x K) W^T + b,   W[n, k] = weight[n, k] * scale[n, k / g],   g = K / G
//
// ``weight`` (N x K) is int8, bfloat16 or float16, ``scale`` (N x G) float32 (G = 1: one scale
// per output channel). Decode reads every weight once per token, so bytes are time: the weights
// stream in their small form and are widened in registers (int8 -> int32 -> float, bfloat16 by
// a 16-bit shift, float16 by F16C's conversion), one row of W at a time read front to back
// (quantized_gemv_row: one sequential stream, prefetched ahead), scaled once per group. Threads
// split the rows in tasks of kQuantizedBlock. ``dequantize_rows`` widens whole rows to float32
// for the matrix-matrix products of prefill (done by a float32 GEMM).
#pragma once

#include <cstdint>
#include <cstring>

#include "gemv.h"
#include "small_gemm.h"

namespace ssmcc {

enum class Storage : int { kInt8 = 0, kBFloat16 = 1, kFloat16 = 2 };

constexpr int kQuantizedBlock = 8;         // output rows a task of the ORT op splits by
constexpr int64_t kQuantizedUnroll = 4;     // accumulators along a row
constexpr int64_t kQuantizedPrefetch = 2048;  // bytes ahead of the read

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
// Output n of row m of x: the weight row read front to back, kUnroll accumulators along k, the
// row kQuantizedPrefetch bytes ahead asked for meanwhile. One row at a time keeps the weights one
// sequential stream: blocks of 8 rows read side by side (8 streams a row apart) moved 21-23 GB/s
// on two Zen 3 cores where this moves 26-29 (a plain read: 36); with weights in L2 it computes
// 18 G weights/s a core.
template <typename W>
inline void quantized_gemv_row(const QuantizedGemvArgs<W>& a, int64_t n, int64_t m) {
  constexpr int64_t L = gemm::kLanes, U = kQuantizedUnroll;
  constexpr int64_t ahead = kQuantizedPrefetch / static_cast<int64_t>(sizeof(W));
  const int64_t K = a.in_features, G = a.groups, g = K / G;
  const int64_t unrolled = g - g % (L * U), full = g - g % L;
  const float* x = a.x + m * K;
  gemm::vfloat total = {};
  float tail = 0.f;
  for (int64_t group = 0; group < G; ++group) {
    const int64_t k0 = group * g;
    const W* w = a.weight + n * K + k0;
    const float* xg = x + k0;
    gemm::vfloat acc[U];
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) acc[u] = gemm::vfloat{};
    int64_t k = 0;
    for (; k < unrolled; k += L * U) {
      prefetch(w + k + ahead);
#pragma GCC unroll 8
      for (int u = 0; u < U; ++u) acc[u] += widen(w + k + u * L) * gemm::load(xg + k + u * L);
    }
    for (; k < full; k += L) acc[0] += widen(w + k) * gemm::load(xg + k);
#pragma GCC unroll 8
    for (int u = 1; u < U; ++u) acc[0] += acc[u];
    const float s = a.scale[n * G + group];
    total += acc[0] * s;
    float rest = 0.f;
    for (; k < g; ++k) rest += widen_one(w[k]) * xg[k];
    tail += rest * s;
  }
  a.y[m * a.out_features + n] = lane_sum(total) + tail + (a.bias ? a.bias[n] : 0.f);
}

// Output columns [n_begin, n_end) of every row of x.
template <typename W>
void quantized_gemv_rows(const QuantizedGemvArgs<W>& a, int64_t n_begin, int64_t n_end) {
  for (int64_t n = n_begin; n < n_end; ++n)
    for (int64_t m = 0; m < a.rows; ++m) quantized_gemv_row(a, n, m);
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
