// Matrix-vector products for decode: y (M x N) = x (M x K) W^T + b, W (N x K) row-major, for
// a few rows M (one token per sequence). Every weight is read once per call, so the product runs
// at the speed of memory: the weight rows are streamed in blocks of kGemvBlock, each block's rows
// stay in L1 while every row of x takes its dot products with them, and kGemvBlock independent
// accumulators keep the FMA units busy. Rows of W are split over threads by the binding
// (gemv_rows over [n_begin, n_end)). GCC's vector extension gives AVX-512 or AVX2 code alike.
#pragma once

#include <cstdint>

#include "small_gemm.h"

namespace ssmcc {

struct GemvArgs {
  const float *x, *weight, *bias;  // (M, K), (N, K), (N,) or null
  float* y;                         // (M, N)
  int64_t rows, out_features, in_features;
};

constexpr int kGemvBlock = 4;

// A block of weight rows is a few short runs of memory (R rows of K weights, K of a few hundred
// to a few thousand): too short for the hardware prefetcher to ramp up on, so each block asks
// for the next block's lines (one prefetch per kPrefetchLine bytes of each row) while it
// computes on its own. Measured on AMD EPYC Zen 5, one thread, int8 weights of mamba-130m's
// shapes from memory: 22 GB/s without, 36-38 GB/s with (a plain read: 36). Prefetching past the
// end of the weights is harmless (a prefetch never faults).
constexpr int64_t kPrefetchLine = 64;

template <typename T>
inline void prefetch(const T* p) {
  __builtin_prefetch(static_cast<const void*>(p), 0, 3);
}

// The sum of a vector's lanes as a tree (log2 lanes dependent adds, not lanes - 1): for short
// rows (K of a few hundred) a serial sum per output costs as much as the products.
inline float lane_sum(gemm::vfloat v) {
#if defined(__AVX512F__)
  return _mm512_reduce_add_ps((__m512)v);
#elif defined(__AVX__)
  const __m256 x = (__m256)v;
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
#else
  float sum = 0.f;
  for (int i = 0; i < gemm::kLanes; ++i) sum += v[i];
  return sum;
#endif
}

// Outputs n0 .. n0 + R - 1 of every row of x. Every loop over the R rows is unrolled so that
// the accumulators live in registers (a rolled one left them on the stack: a load and a store
// beside every FMA).
template <int R>
inline void gemv_block(const GemvArgs& a, int64_t n0) {
  const int64_t K = a.in_features, full = K - K % gemm::kLanes;
  const float* w = a.weight + n0 * K;
  for (int64_t m = 0; m < a.rows; ++m) {
    const float* x = a.x + m * K;
    gemm::vfloat acc[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) acc[r] = gemm::vfloat{};
    for (int64_t k = 0; k < full; k += gemm::kLanes) {
      const gemm::vfloat xv = gemm::load(x + k);
      if (k % (kPrefetchLine / sizeof(float)) == 0) {
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) prefetch(w + (R + r) * K + k);
      }
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) acc[r] += gemm::load(w + r * K + k) * xv;
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      float sum = lane_sum(acc[r]);
      for (int64_t k = full; k < K; ++k) sum += w[r * K + k] * x[k];
      a.y[m * a.out_features + n0 + r] = sum + (a.bias ? a.bias[n0 + r] : 0.f);
    }
  }
}

// Output columns [n_begin, n_end) of every row of x.
inline void gemv_rows(const GemvArgs& a, int64_t n_begin, int64_t n_end) {
  int64_t n0 = n_begin;
  for (; n0 + kGemvBlock <= n_end; n0 += kGemvBlock) gemv_block<kGemvBlock>(a, n0);
  for (; n0 < n_end; ++n0) gemv_block<1>(a, n0);
}

}  // namespace ssmcc
