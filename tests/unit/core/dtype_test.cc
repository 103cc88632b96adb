#include "core/dtype.h"

#include <gtest/gtest.h>
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/rng.h"

namespace zerod {
namespace {

TEST(DType, NamesAndParsing) {
  EXPECT_EQ(parse_dtype("bf16"), DType::kBF16);
  EXPECT_EQ(parse_dtype("float16"), DType::kF16);
  EXPECT_EQ(parse_dtype("fp32"), DType::kF32);
  EXPECT_EQ(dtype_name(DType::kBF16), "bf16");
  EXPECT_EQ(dtype_size(DType::kF16), 2u);
  EXPECT_THROW(parse_dtype("int8"), InputError);
}

TEST(DType, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(round_bf16(1.0f + 0x1p-8f), 1.0f);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even): rounds up to even.
  EXPECT_EQ(round_bf16(1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-6f);
  EXPECT_EQ(round_bf16(1.0f + 0x1p-8f + 0x1p-20f), 1.0f + 0x1p-7f);
  EXPECT_TRUE(std::isnan(round_bf16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isinf(round_bf16(std::numeric_limits<float>::infinity())));
  // The largest finite float rounds up to infinity in bf16.
  EXPECT_TRUE(std::isinf(round_bf16(std::numeric_limits<float>::max())));
}

#if defined(__F16C__)
TEST(DType, F16MatchesHardwareConversion) {
  // Compare against the F16C instructions over a spread of magnitudes, signs and specials.
  Rng rng(7);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t bits = static_cast<uint32_t>(rng.next_u64());
    float f;
    std::memcpy(&f, &bits, 4);
    const uint16_t want = _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
    const uint16_t got = f32_to_f16_bits(f);
    if (std::isnan(f)) {
      EXPECT_EQ(got & 0x7c00u, 0x7c00u);
      EXPECT_NE(got & 0x3ffu, 0u);
      continue;
    }
    ASSERT_EQ(got, want) << "f=" << f << " bits=" << std::hex << bits;
  }
  for (uint32_t h = 0; h < 65536; ++h) {
    const float want = _cvtsh_ss(static_cast<uint16_t>(h));
    const float got = f16_bits_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got));
    } else {
      ASSERT_EQ(got, want) << "h=" << h;
    }
  }
}
#endif

TEST(DType, F16Boundaries) {
  EXPECT_EQ(round_f16(65504.0f), 65504.0f);
  EXPECT_TRUE(std::isinf(round_f16(65520.0f)));  // halfway to 65536 rounds to even: infinity
  EXPECT_EQ(round_f16(65519.0f), 65504.0f);
  EXPECT_EQ(round_f16(0x1p-24f), 0x1p-24f);    // smallest subnormal
  EXPECT_EQ(round_f16(0x1p-25f), 0.0f);        // halfway to zero: even (zero)
  EXPECT_EQ(round_f16(-0x1p-14f), -0x1p-14f);  // smallest normal
}

}  // namespace
}  // namespace zerod
