// A projection weight of a fused mixer (math: ssmcc/ops/mamba_mixer.py): float32, or stored small
// as gemv_quantized.h's products read it (int8, bfloat16 or float16 with a float32 scale per row
// and group: W[n, k] = data[n, k] * scale[n, k / (K / G)]).
//
//   mixer_weight_gemv_rows  y = x W^T for output columns [n_begin, n_end): the step's
//                           matrix-vector products, reading the small weight once
//   mixer_weight_dense_t    W^T as float32 (K x N): what the sequence path's GEMM reads
//   transposed              a float32 (rows, cols) matrix as (cols, rows) (A, the projections)
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "gemv.h"
#include "gemv_quantized.h"

namespace ssmcc {

constexpr int kFloat32Storage = -1;  // MixerWeight::storage of a float32 weight (no scale)

struct MixerWeight {
  const void* data;     // (N, K)
  const float* scale;   // (N, G); null for float32
  int storage;          // kFloat32Storage or a Storage
  int64_t groups;       // G (1 for float32)

  const float* dense() const { return static_cast<const float*>(data); }
};

// "" when ``w`` can be read as a weight of ``in_features`` columns, else why not.
inline std::string check_mixer_weight(const char* op, const char* name, const MixerWeight& w,
                                      int64_t in_features) {
  const std::string where = std::string(op) + ": " + name + " ";
  if (w.storage == kFloat32Storage) return "";
  if (w.storage < 0 || w.storage > static_cast<int>(Storage::kFloat16))
    return where + "storage must be -1 (float32), 0 (int8), 1 (bfloat16) or 2 (float16), got " +
           std::to_string(w.storage);
  if (w.scale == nullptr) return where + "is stored small but has no scale";
  if (w.groups < 1 || in_features % w.groups != 0)
    return where + "scale groups=" + std::to_string(w.groups) + " must divide its " +
           std::to_string(in_features) + " columns";
  return "";
}

// fn(weight) with ``w``'s stored data typed by its storage (w must not be float32).
template <typename Fn>
void with_stored(const MixerWeight& w, Fn fn) {
  if (w.storage == static_cast<int>(Storage::kInt8))
    fn(static_cast<const int8_t*>(w.data));
  else if (w.storage == static_cast<int>(Storage::kBFloat16))
    fn(static_cast<const uint16_t*>(w.data));
  else
    fn(static_cast<const _Float16*>(w.data));
}

inline void mixer_weight_gemv_rows(const MixerWeight& w, const float* x, float* y, int64_t rows,
                                   int64_t out_features, int64_t in_features, int64_t n_begin,
                                   int64_t n_end) {
  if (w.storage == kFloat32Storage) {
    gemv_rows(GemvArgs{x, w.dense(), nullptr, y, rows, out_features, in_features}, n_begin,
              n_end);
    return;
  }
  with_stored(w, [&](const auto* weight) {
    using W = std::remove_cv_t<std::remove_pointer_t<decltype(weight)>>;
    const QuantizedGemvArgs<W> args{x,    weight,       w.scale,     nullptr,
                                    y,    rows,         out_features, in_features,
                                    w.groups};
    quantized_gemv_rows(args, n_begin, n_end);
  });
}

// (rows, cols) -> (cols, rows); empty when ``skip`` (a step reads the weights as they are).
inline std::vector<float> transposed(const float* data, int64_t rows, int64_t cols, bool skip) {
  std::vector<float> out(skip ? 0 : rows * cols);
  if (!skip)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = data[r * cols + c];
  return out;
}

// W^T (in_features x out_features) as float32; empty when ``skip``.
inline std::vector<float> mixer_weight_dense_t(const MixerWeight& w, int64_t out_features,
                                               int64_t in_features, bool skip) {
  if (skip || w.storage == kFloat32Storage)
    return transposed(w.dense(), out_features, in_features, skip);
  std::vector<float> dense(out_features * in_features);
  with_stored(w, [&](const auto* weight) {
    dequantize_rows(weight, w.scale, dense.data(), in_features, w.groups, 0, out_features);
  });
  return transposed(dense.data(), out_features, in_features, false);
}

}  // namespace ssmcc
