// Scalar math written so that GCC vectorises the loops that call it (only +, *, /, compares,
// selects and integer bit operations; no libm calls). std::exp / std::tanh are not vectorised
// without -ffast-math, which this project does not use.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace zerod::cpu {

// e^x in fp32: Cody-Waite range reduction x = n ln2 + r (|r| <= ln2/2) and the classic
// degree-6 minimax polynomial for e^r (the Cephes expf coefficients), then a scale by 2^n applied
// as two exact power-of-two multiplications so that results down to the subnormal range are
// right. Error within ~2 ulp of the correctly rounded value for normal results. Returns +inf
// above ln(FLT_MAX), 0 below -104 (and for -inf); NaN flows through the arithmetic unchanged.
// Outside [-104, ln(FLT_MAX)] the intermediate values are garbage (integer math is unsigned, so
// never undefined) and the two final selects replace them.
inline float exp_f32(float x) {
  constexpr float kHi = 88.72283f;  // just below ln(FLT_MAX)
  constexpr float kLo = -104.0f;    // e^-104 < half the smallest subnormal
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;  // few mantissa bits: n * kLn2Hi is exact
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float t = x * kLog2e + kMagic;
  // n = round(x * log2(e)), in [-150, 128] for x in [kLo, kHi].
  const int32_t n = static_cast<int32_t>(std::bit_cast<uint32_t>(t) - 0x4B400000u);
  const float nf = t - kMagic;
  float r = x - nf * kLn2Hi;
  r = r - nf * kLn2Lo;
  const float z = r * r;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * z + r + 1.0f;
  // 2^n = 2^n1 * 2^n2 with both halves in the normal exponent range.
  const int32_t n1 = n >> 1;
  const uint32_t e1 = static_cast<uint32_t>(n1) + 127u;
  const uint32_t e2 = static_cast<uint32_t>(n) - static_cast<uint32_t>(n1) + 127u;
  float result = y * std::bit_cast<float>(e1 << 23) * std::bit_cast<float>(e2 << 23);
  result = x > kHi ? std::numeric_limits<float>::infinity() : result;
  result = x < kLo ? 0.0f : result;
  return result;
}

// tanh(x) = sign(x) (1 - e) / (1 + e) with e = e^(-2|x|) in [0, 1]: never overflows; absolute
// error ~1e-7 everywhere (relative error grows only for |x| < ~1e-3, where tanh(x) ~ x and
// callers add it to 1).
inline float tanh_f32(float x) {
  const float e = exp_f32(-2.0f * std::fabs(x));
  const float t = (1.0f - e) / (1.0f + e);
  return std::copysign(t, x);
}

}  // namespace zerod::cpu
