// exp, softplus and silu on vectors of floats, inline (no call into libm's vector library per
// element: in the scans those calls cost more than the arithmetic around them).
//
// exp_vector: range
// reduction x = n ln2 + r, |r| <= ln2 / 2 (n rounded by integer conversion), then a degree-6
// polynomial for exp(r) (the Taylor series, whose remainder there is below float's rounding)
// scaled by 2^n through the exponent bits. Measured relative error: 4.4e-7 (4 ulp) at worst over
// [-87, 88], 2.9e-7 over [-30, 10]; below -87 the result is 0 (where expf gives a tiny normal or
// denormal), above 88 it saturates. The scans' decays exp(dt A) are most of their time.
#pragma once

#include <cstdint>
#include <cstring>

#include "small_gemm.h"

namespace ssmcc {

typedef int32_t vint __attribute__((vector_size(gemm::kLanes * sizeof(int32_t))));

inline gemm::vfloat exp_vector(gemm::vfloat x) {
  using gemm::vfloat;
  const vfloat low = vfloat{} - 87.0f, high = vfloat{} + 88.0f;
  const auto below = x < low;
  x = below ? low : x;
  x = x > high ? high : x;
  // n = round(x / ln2) through integer conversion (the float trick of adding 1.5 * 2^23 is
  // folded away under -ffast-math)
  const vfloat y = x * 1.44269504088896341f;
  const vint n_int = __builtin_convertvector(y + (y < 0 ? vfloat{} - 0.5f : vfloat{} + 0.5f), vint);
  const vfloat n = __builtin_convertvector(n_int, vfloat);
  const vint exponent = (n_int + 127) << 23;  // 2^n as float bits
  const vfloat r = x - n * 0.693359375f + n * 2.12194440e-4f;  // ln2 in two parts
  vfloat p = vfloat{} + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  vfloat scale;
  std::memcpy(&scale, &exponent, sizeof scale);
  const vfloat result = p * scale;
  return below ? vfloat{} : result;
}

// log(1 + u) for u in [0, 1]: 2 atanh(s) with s = u / (2 + u) in [0, 1/3], the odd series up to
// s^15 (the next term is below 5e-9).
inline gemm::vfloat log1p_unit(gemm::vfloat u) {
  using gemm::vfloat;
  const vfloat s = u / (u + 2.0f), s2 = s * s;
  vfloat p = vfloat{} + 1.0f / 15;
  p = p * s2 + 1.0f / 13;
  p = p * s2 + 1.0f / 11;
  p = p * s2 + 1.0f / 9;
  p = p * s2 + 1.0f / 7;
  p = p * s2 + 1.0f / 5;
  p = p * s2 + 1.0f / 3;
  p = p * s2 + 1.0f;
  return 2.0f * s * p;
}

// softplus(x) = log(1 + exp(x)) = max(x, 0) + log(1 + exp(-|x|)) (torch returns x above 20;
// the difference there is below float's rounding of x).
inline gemm::vfloat softplus_vector(gemm::vfloat x) {
  using gemm::vfloat;
  const vfloat magnitude = x < 0 ? -x : x;
  return (x > 0 ? x : vfloat{}) + log1p_unit(exp_vector(-magnitude));
}

// silu(z) = z / (1 + exp(-z)).
inline gemm::vfloat silu_vector(gemm::vfloat z) { return z / (1.0f + exp_vector(-z)); }

}  // namespace ssmcc
