#include "kernels/cpu/simd_math.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace zerod::cpu {
namespace {

// Distance in units in the last place between two finite floats of the same sign.
int64_t ulp_distance(float a, float b) {
  return std::llabs(static_cast<int64_t>(std::bit_cast<int32_t>(a)) -
                    static_cast<int64_t>(std::bit_cast<int32_t>(b)));
}

TEST(SimdMath, ExpWithinTwoUlpOverTheNormalRange) {
  int64_t worst = 0;
  // ~200k points spread over the whole range where the result is a normal float.
  for (float x = -87.0f; x < 88.0f; x += 0.00087f) {
    const float want = static_cast<float>(std::exp(static_cast<double>(x)));
    const int64_t d = ulp_distance(exp_f32(x), want);
    worst = std::max(worst, d);
    ASSERT_LE(d, 2) << "x=" << x;
  }
  for (float x : {0.0f, -0.0f, 1e-8f, -1e-8f, 0.5f, -0.5f, 1.0f, 88.7f, -87.3f}) {
    const float want = static_cast<float>(std::exp(static_cast<double>(x)));
    EXPECT_LE(ulp_distance(exp_f32(x), want), 2) << "x=" << x;
  }
  RecordProperty("worst_ulp", static_cast<int>(worst));
}

TEST(SimdMath, ExpSpecialValues) {
  EXPECT_EQ(exp_f32(0.0f), 1.0f);
  EXPECT_EQ(exp_f32(-INFINITY), 0.0f);
  EXPECT_EQ(exp_f32(-200.0f), 0.0f);
  EXPECT_EQ(exp_f32(INFINITY), INFINITY);
  EXPECT_EQ(exp_f32(89.0f), INFINITY);
  EXPECT_TRUE(std::isnan(exp_f32(std::numeric_limits<float>::quiet_NaN())));
  // Subnormal results keep their magnitude (within a relative 1e-3 of the true value).
  const float sub = exp_f32(-95.0f);
  EXPECT_GT(sub, 0.0f);
  EXPECT_LT(sub, std::numeric_limits<float>::min());
  EXPECT_NEAR(sub / std::exp(-95.0), 1.0, 1e-3);
}

TEST(SimdMath, TanhAbsoluteErrorIsTiny) {
  for (float x = -12.0f; x < 12.0f; x += 0.0013f) {
    ASSERT_NEAR(tanh_f32(x), std::tanh(static_cast<double>(x)), 2e-7) << "x=" << x;
  }
  EXPECT_EQ(tanh_f32(0.0f), 0.0f);
  EXPECT_EQ(tanh_f32(100.0f), 1.0f);
  EXPECT_EQ(tanh_f32(-100.0f), -1.0f);
  EXPECT_TRUE(std::isnan(tanh_f32(std::numeric_limits<float>::quiet_NaN())));
}

}  // namespace
}  // namespace zerod::cpu
