// Matrix-vector products for decode: y (M x N) = x (M x K) W^T + b, W (N x K) row-major, for
// a few rows M (one token per sequence). Every weight is read once per call, so the product runs
// at the speed of memory when M = 1 and near the FMA units' speed for M of a dozen or more. Rows
// of W are split over threads by the binding (gemv_rows over [n_begin, n_end)). GCC's vector
// extension gives AVX-512 or AVX2 code alike.
//
// A tile is RW weight rows x RM rows of x: RW x RM accumulators of kLanes floats, summed over k,
// each weight vector loaded once per tile and each x vector once per RW products.
//   M = 1: 16 weight rows per tile (8 with AVX2), no software prefetch. Measured on AMD EPYC
//          Zen 4, 2 threads, 500 MB of the granite-hybrid-200m step's shapes: the old 4-row
//          tiles with a prefetch one tile ahead read 30 GB/s, 16-row tiles 44 GB/s, a plain sum
//          of the same bytes 43 (the prefetch made no difference at 4 rows and cost at 16; one
//          row at a time with 4 accumulators along it and no prefetch also read 44).
//   M > 1: 8 weight rows x 3 rows of x (4 x 2 with AVX2): the weight block stays in L1 while
//          the rows of x pass over it. At M = 16: 36 ms against 46 ms for the old 4 x 1 tiles.
#pragma once

#include <cstdint>

#include "small_gemm.h"

namespace ssmcc {

struct GemvArgs {
  const float *x, *weight, *bias;  // (M, K), (N, K), (N,) or null
  float* y;                         // (M, N)
  int64_t rows, out_features, in_features;
};

// Weight rows per task unit of the bindings (a multiple of every tile's RW).
constexpr int kGemvBlock = 16;

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

// Outputs n0 .. n0 + RW - 1 of rows m0 .. m0 + RM - 1 of x. Every loop over the tile is unrolled
// so that the accumulators live in registers (a rolled one left them on the stack: a load and a
// store beside every FMA).
template <int RW, int RM>
inline void gemv_tile(const GemvArgs& a, int64_t n0, int64_t m0) {
  const int64_t K = a.in_features, full = K - K % gemm::kLanes;
  const float* w = a.weight + n0 * K;
  const float* x = a.x + m0 * K;
  gemm::vfloat acc[RM][RW];
#pragma GCC unroll 32
  for (int i = 0; i < RM; ++i)
#pragma GCC unroll 32
    for (int r = 0; r < RW; ++r) acc[i][r] = gemm::vfloat{};
  for (int64_t k = 0; k < full; k += gemm::kLanes) {
    gemm::vfloat wv[RW];
#pragma GCC unroll 32
    for (int r = 0; r < RW; ++r) wv[r] = gemm::load(w + r * K + k);
#pragma GCC unroll 32
    for (int i = 0; i < RM; ++i) {
      const gemm::vfloat xv = gemm::load(x + i * K + k);
#pragma GCC unroll 32
      for (int r = 0; r < RW; ++r) acc[i][r] += wv[r] * xv;
    }
  }
#pragma GCC unroll 32
  for (int i = 0; i < RM; ++i)
#pragma GCC unroll 32
    for (int r = 0; r < RW; ++r) {
      float sum = lane_sum(acc[i][r]);
      for (int64_t k = full; k < K; ++k) sum += w[r * K + k] * x[i * K + k];
      a.y[(m0 + i) * a.out_features + n0 + r] = sum + (a.bias ? a.bias[n0 + r] : 0.f);
    }
}

// Tile shapes that keep accumulators and weight vectors in registers: 32 vector registers with
// AVX-512, 16 with AVX2 (a weight vector used once is folded into its FMA, so M = 1 needs only
// the accumulators).
constexpr int kSingleRowTile = gemm::kLanes == 16 ? 16 : 8;  // RW at M = 1
constexpr int kBatchWeightTile = gemm::kLanes == 16 ? 8 : 4;  // RW at M > 1
constexpr int kBatchRowTile = gemm::kLanes == 16 ? 3 : 2;     // RM at M > 1

// Outputs n0 .. n0 + RW - 1 of every row of x, in tiles of kBatchRowTile rows of x (then fewer).
template <int RW>
inline void gemv_weight_block(const GemvArgs& a, int64_t n0) {
  int64_t m = 0;
  for (; m + kBatchRowTile <= a.rows; m += kBatchRowTile) gemv_tile<RW, kBatchRowTile>(a, n0, m);
  if (kBatchRowTile == 3 && a.rows - m == 2) gemv_tile<RW, 2>(a, n0, m), m += 2;
  if (a.rows - m == 1) gemv_tile<RW, 1>(a, n0, m);
}

// Output columns [n_begin, n_end) of every row of x.
inline void gemv_rows(const GemvArgs& a, int64_t n_begin, int64_t n_end) {
  int64_t n0 = n_begin;
  if (a.rows == 1) {
    for (; n0 + kSingleRowTile <= n_end; n0 += kSingleRowTile)
      gemv_tile<kSingleRowTile, 1>(a, n0, 0);
    for (; n0 + 4 <= n_end; n0 += 4) gemv_tile<4, 1>(a, n0, 0);
  } else {
    for (; n0 + kBatchWeightTile <= n_end; n0 += kBatchWeightTile)
      gemv_weight_block<kBatchWeightTile>(a, n0);
  }
  for (; n0 < n_end; ++n0) gemv_weight_block<1>(a, n0);
}

}  // namespace ssmcc
