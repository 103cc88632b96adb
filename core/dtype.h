// Floating-point storage types and scalar conversions. Vectorised array casts live in kernels/.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace zerod {

enum class DType : uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2 };

constexpr size_t dtype_size(DType t) {
  return t == DType::kF32 ? 4 : 2;
}
std::string_view dtype_name(DType t);  // "fp32", "bf16", "fp16"
// Accepts fp32/float32, bf16/bfloat16, fp16/float16/half; throws InputError otherwise.
DType parse_dtype(std::string_view name);

// fp32 -> bf16 bits, round to nearest even; NaN stays NaN (quiet).
inline uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_bits_to_f32(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}
// The nearest bf16 value, as a float.
inline float round_bf16(float f) {
  return bf16_bits_to_f32(f32_to_bf16_bits(f));
}

// IEEE binary16 conversions, round to nearest even, overflow to infinity, subnormals kept.
uint16_t f32_to_f16_bits(float f);
float f16_bits_to_f32(uint16_t h);
inline float round_f16(float f) {
  return f16_bits_to_f32(f32_to_f16_bits(f));
}

constexpr float kF16Max = 65504.0f;

}  // namespace zerod
