// The activations of ssmcc/ops/activations.py, by the code the kernels take (FORMS there):
//
//   0 identity   x
//   1 silu       x / (1 + exp(-x))
//   2 gelu       0.5 x (1 + erf(x / sqrt(2)))
//   3 gelu_tanh  0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//   4 relu       max(x, 0)
//   5 relu2      max(x, 0)^2
//
// ``activate_span`` applies one to a span with the choice made once, outside the loop, so each
// loop is a plain elementwise loop that vectorises.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

namespace ssmcc {

enum class Activation : int32_t {
  kIdentity = 0,
  kSilu = 1,
  kGelu = 2,
  kGeluTanh = 3,
  kRelu = 4,
  kRelu2 = 5,
};

// "" when ``code`` is one of Activation, else why not (``op`` leads the message).
inline std::string check_activation(const std::string& op, int64_t code) {
  if (code >= 0 && code <= static_cast<int64_t>(Activation::kRelu2)) return "";
  return op + ": activation must be 0 (identity), 1 (silu), 2 (gelu), 3 (gelu_tanh), 4 (relu) "
              "or 5 (relu2), got " + std::to_string(code);
}

inline float activate(float x, Activation activation) {
  switch (activation) {
    case Activation::kSilu:
      return x / (1.f + std::exp(-x));
    case Activation::kGelu:
      return 0.5f * x * (1.f + std::erf(x * 0.70710678118654752f));
    case Activation::kGeluTanh:
      return 0.5f * x * (1.f + std::tanh(0.79788456080286536f * (x + 0.044715f * x * x * x)));
    case Activation::kRelu:
      return x > 0.f ? x : 0.f;
    case Activation::kRelu2:
      return x > 0.f ? x * x : 0.f;
    default:
      return x;
  }
}

template <Activation kActivation>
inline void activate_span_as(float* v, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) v[i] = activate(v[i], kActivation);
}

// v[i] = activation(v[i]) for i < n.
inline void activate_span(float* v, int64_t n, Activation activation) {
  switch (activation) {
    case Activation::kSilu:
      return activate_span_as<Activation::kSilu>(v, n);
    case Activation::kGelu:
      return activate_span_as<Activation::kGelu>(v, n);
    case Activation::kGeluTanh:
      return activate_span_as<Activation::kGeluTanh>(v, n);
    case Activation::kRelu:
      return activate_span_as<Activation::kRelu>(v, n);
    case Activation::kRelu2:
      return activate_span_as<Activation::kRelu2>(v, n);
    default:
      return;
  }
}

}  // namespace ssmcc
