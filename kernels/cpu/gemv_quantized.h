// Matrix-vector products with weights stored small (math: ssmcc/ops/quantized_linear.py):
//
//   y (M x N) = x (M x K) W^T + b,   W[n, k] = weight[n, k] * scale[n, k / g],   g = K / G
//
// ``weight`` (N x K) is int8, bfloat16 or float16, ``scale`` (N x G) float32 (G = 1: one scale
// per output channel). Decode reads every weight once per token, so bytes are time: the weights
// stream in their small form and are widened in registers (int8 -> int32 -> float, bfloat16 by
// a 16-bit shift, float16 by F16C's conversion), one row of W at a time read front to back
// (quantized_gemv_rows_of: one sequential stream, prefetched ahead), scaled once per group. Threads
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
constexpr int64_t kPrefetchLine = 64;         // bytes a prefetch brings

template <typename T>
inline void prefetch(const T* p) {
  __builtin_prefetch(static_cast<const void*>(p), 0, 3);
}

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

// Output n of MB rows m .. m + MB - 1 of x: the weight row read front to back once (one
// sequential stream, kQuantizedPrefetch bytes ahead asked for meanwhile), each weight vector
// widened once for the MB rows, kQuantizedUnroll / MB accumulators a row of x along k so that
// kQuantizedUnroll FMA chains hide the FMA latency. Measured on one Zen 3 core and two:
//   - blocks of 8 weight rows read side by side (8 streams a row apart), the old form, moved
//     21-23 GB/s of int8 weights on two cores where one row at a time moves 26-29 (a plain read
//     of memory: 36); with weights in L2 a core computes 18 G weights/s;
//   - widening per row of x (a batched decode step) cost as much as the products: 4 rows of x
//     took 3.2x the time of one, 2.6x in fours; pairs (2 accumulators a row) were slower than
//     two single rows (the second reads the weight row from L1), so the rest go one at a time.
template <int MB, typename W>
inline void quantized_gemv_rows_of(const QuantizedGemvArgs<W>& a, int64_t n, int64_t m) {
  constexpr int64_t L = gemm::kLanes, U = MB >= kQuantizedUnroll ? 1 : kQuantizedUnroll / MB;
  constexpr int64_t ahead = kQuantizedPrefetch / static_cast<int64_t>(sizeof(W));
  constexpr int64_t line = kPrefetchLine / static_cast<int64_t>(sizeof(W));
  const int64_t K = a.in_features, G = a.groups, g = K / G;
  const int64_t unrolled = g - g % (L * U), full = g - g % L;
  gemm::vfloat total[MB];
  float tail[MB];
#pragma GCC unroll 8
  for (int j = 0; j < MB; ++j) total[j] = gemm::vfloat{}, tail[j] = 0.f;
  for (int64_t group = 0; group < G; ++group) {
    const int64_t k0 = group * g;
    const W* w = a.weight + n * K + k0;
    const float* x = a.x + m * K + k0;
    gemm::vfloat acc[MB][U];
#pragma GCC unroll 8
    for (int j = 0; j < MB; ++j)
#pragma GCC unroll 8
      for (int u = 0; u < U; ++u) acc[j][u] = gemm::vfloat{};
    int64_t k = 0;
    for (; k < unrolled; k += L * U) {
      if ((L * U) >= line || k % line == 0) prefetch(w + k + ahead);
#pragma GCC unroll 8
      for (int u = 0; u < U; ++u) {
        const gemm::vfloat wide = widen(w + k + u * L);
#pragma GCC unroll 8
        for (int j = 0; j < MB; ++j) acc[j][u] += wide * gemm::load(x + j * K + k + u * L);
      }
    }
    for (; k < full; k += L) {
      const gemm::vfloat wide = widen(w + k);
#pragma GCC unroll 8
      for (int j = 0; j < MB; ++j) acc[j][0] += wide * gemm::load(x + j * K + k);
    }
    const float s = a.scale[n * G + group];
#pragma GCC unroll 8
    for (int j = 0; j < MB; ++j) {
#pragma GCC unroll 8
      for (int u = 1; u < U; ++u) acc[j][0] += acc[j][u];
      total[j] += acc[j][0] * s;
      float rest = 0.f;
      for (int64_t r = k; r < g; ++r) rest += widen_one(w[r]) * x[j * K + r];
      tail[j] += rest * s;
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < MB; ++j)
    a.y[(m + j) * a.out_features + n] = lane_sum(total[j]) + tail[j] + (a.bias ? a.bias[n] : 0.f);
}

// Output columns [n_begin, n_end) of every row of x, the rows of x in fours, the rest one by one.
template <typename W>
void quantized_gemv_rows(const QuantizedGemvArgs<W>& a, int64_t n_begin, int64_t n_end) {
  for (int64_t n = n_begin; n < n_end; ++n) {
    int64_t m = 0;
    for (; m + 4 <= a.rows; m += 4) quantized_gemv_rows_of<4>(a, n, m);
    for (; m < a.rows; ++m) quantized_gemv_rows_of<1>(a, n, m);
  }
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
