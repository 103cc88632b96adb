#include "kernels/cpu/cast.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "kernels/cpu/parallel.h"

namespace zerod::cpu {

namespace {

inline float bf16_round_value(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t nan_bits = (u | 0x00400000u) & 0xffff0000u;  // quiet, sign kept
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  return std::bit_cast<float>((u & 0x7fffffffu) > 0x7f800000u ? nan_bits : rounded);
}

inline float f16_round_value(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t sign = u & 0x80000000u;
  const uint32_t abs = u & 0x7fffffffu;
  // Normal half range: keep 10 mantissa bits, round to nearest even.
  const uint32_t normal = (abs + 0xfffu + ((abs >> 13) & 1u)) & ~0x1fffu;
  // Below 2^-14 half values are multiples of 2^-24; adding 0.5 (whose ulp is 2^-24) rounds to
  // that grid with the hardware's round-to-nearest-even, subtracting it again is exact.
  const float sub = (std::bit_cast<float>(abs) + 0.5f) - 0.5f;
  uint32_t r = abs < 0x38800000u ? std::bit_cast<uint32_t>(sub) : normal;
  r = abs >= 0x477ff000u ? 0x7f800000u : r;  // >= 65520 (incl. inf): infinity
  r = abs > 0x7f800000u ? 0x7fc00000u : r;   // NaN: quiet NaN
  return std::bit_cast<float>(sign | r);
}

}  // namespace

void round_bf16_inplace(float* x, int64_t n) {
  cast_round(x, x, n, DType::kBF16);
}
void round_f16_inplace(float* x, int64_t n) {
  cast_round(x, x, n, DType::kF16);
}

void cast_round(float* out, const float* in, int64_t n, DType dtype) {
  if (dtype == DType::kF32 || n < 4 * kParallelMinElems) {
    cast_round_serial(out, in, n, dtype);
    return;
  }
  // Blocks of the serial rounding in parallel (element-wise: the same bits for any split).
  constexpr int64_t kBlock = kParallelMinElems;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t i0 = b * kBlock;
    cast_round_serial(out + i0, in + i0, std::min(kBlock, n - i0), dtype);
  }
}

void cast_round_serial(float* out, const float* in, int64_t n, DType dtype) {
  switch (dtype) {
    case DType::kF32:
      if (out != in && n > 0) std::memcpy(out, in, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kBF16:
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_round_value(in[i]);
      return;
    case DType::kF16:
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) out[i] = f16_round_value(in[i]);
      return;
  }
}

}  // namespace zerod::cpu
