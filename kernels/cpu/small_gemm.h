// Small dense products for the chunked kernels: C (M x N) (+)= A (M x K) . B (K x N), float32.
//
//   C[m, j] = (accumulate ? C[m, j] : 0) + sum_{k < K_m} A[m * a_row + k * a_col] * B[k * ldb + j]
//
// with K_m = K, or K_m = min(K, m + 1) rounded up to the row tile when ``lower_A`` (A is lower
// triangular and stores zeros above its diagonal up to column K: the tile may read them).
// B and C have contiguous rows (strides ldb, ldc); A is read one element at a time, so any
// strides serve (a transposed A costs nothing). Sizes are those of one SSD chunk (tens to a few
// hundred): the operands live in L1/L2, and what matters is keeping a tile of C in registers
// while k runs. A tile is kRows rows x kVectors vectors of kLanes floats; GCC's vector extension
// gives the same code on AVX-512 (16 lanes) and AVX2 (8 lanes, a narrower tile so that the
// accumulators, the row of B and the broadcast fit the 16 ymm registers). Columns that do not
// fill a vector run in a scalar loop.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace ssmcc::gemm {

#if defined(__AVX512F__)
constexpr int kLanes = 16;
constexpr int kRows = 4;
#else
constexpr int kLanes = 8;
constexpr int kRows = 3;
#endif
constexpr int kVectors = 4;

typedef float vfloat __attribute__((vector_size(kLanes * sizeof(float))));

inline vfloat load(const float* p) {
  vfloat v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void store(float* p, vfloat v) { std::memcpy(p, &v, sizeof v); }

// A store that bypasses the caches (``p`` aligned to the vector); streaming_done() orders such
// stores before the data is handed to another thread.
inline void store_streaming(float* p, vfloat v) {
#if defined(__AVX512F__) && defined(__x86_64__)
  _mm512_stream_ps(p, reinterpret_cast<__m512>(v));
#elif defined(__AVX__) && defined(__x86_64__)
  _mm256_stream_ps(p, reinterpret_cast<__m256>(v));
#else
  store(p, v);
#endif
}

inline void streaming_done() {
#if defined(__SSE__) && defined(__x86_64__)
  _mm_sfence();
#endif
}

struct Operands {
  const float* A;
  int64_t a_row, a_col;
  const float* B;
  int64_t ldb;
  float* C;
  int64_t ldc;
  bool accumulate;
};

// R rows x V vectors of C, starting at row 0 / column ``col`` of ``o``, over k < K.
template <int R, int V>
inline void tile(const Operands& o, int64_t col, int64_t K) {
  vfloat acc[R][V];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      acc[r][v] = o.accumulate ? load(o.C + r * o.ldc + col + v * kLanes) : vfloat{};
  for (int64_t k = 0; k < K; ++k) {
    const float* b_row = o.B + k * o.ldb + col;
    vfloat b[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) b[v] = load(b_row + v * kLanes);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const vfloat a = vfloat{} + o.A[r * o.a_row + k * o.a_col];
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v] += a * b[v];
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) store(o.C + r * o.ldc + col + v * kLanes, acc[r][v]);
}

template <int V>
inline void tile_rows(int rows, const Operands& o, int64_t col, int64_t K) {
  static_assert(kRows <= 4, "tile_rows dispatches up to 4 rows");
  switch (rows) {
    case 4: tile<4, V>(o, col, K); break;
    case 3: tile<3, V>(o, col, K); break;
    case 2: tile<2, V>(o, col, K); break;
    default: tile<1, V>(o, col, K); break;
  }
}

inline void scalar_columns(int rows, const Operands& o, int64_t col, int64_t end, int64_t K) {
  for (int r = 0; r < rows; ++r)
    for (int64_t j = col; j < end; ++j) {
      float sum = o.accumulate ? o.C[r * o.ldc + j] : 0.f;
      for (int64_t k = 0; k < K; ++k) sum += o.A[r * o.a_row + k * o.a_col] * o.B[k * o.ldb + j];
      o.C[r * o.ldc + j] = sum;
    }
}

// C (M x N) (+)= A (M x K) . B (K x N); see the header comment.
inline void matmul(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_row, int64_t a_col,
                   const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate,
                   bool lower_A = false) {
  constexpr int64_t kWide = int64_t(kVectors) * kLanes;
  for (int64_t m = 0; m < M; m += kRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kRows, M - m));
    const int64_t K_tile = lower_A ? std::min(K, m + rows) : K;
    const Operands o{A + m * a_row, a_row, a_col, B, ldb, C + m * ldc, ldc, accumulate};
    int64_t col = 0;
    for (; col + kWide <= N; col += kWide) tile_rows<kVectors>(rows, o, col, K_tile);
    for (; col + kLanes <= N; col += kLanes) tile_rows<1>(rows, o, col, K_tile);
    if (col < N) scalar_columns(rows, o, col, N, K_tile);
  }
}

}  // namespace ssmcc::gemm
