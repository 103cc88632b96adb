#include "kernels/cpu/reduce.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.h"

namespace zerod::cpu {
namespace {

using test::VecF;

TEST(SumSquares, MatchesDoubleSumAndIsThreadCountIndependent) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{17}, int64_t{3 * 16384 + 5}, int64_t{200003}}) {
    SCOPED_TRACE(n);
    const VecF x = test::randn(n, 800 + n, 3.0f);
    double want = 0.0;  // sequential double sum of exact squares
    for (float e : x) want += static_cast<double>(e) * e;
    const auto [one, two] = test::with_1_and_2_threads([&] { return sum_squares(x.data(), n); });
    // Different summation orders of n positive doubles: relative error <= n * 2^-53.
    EXPECT_NEAR(one, want, 1e-16 * static_cast<double>(n) * want);
    EXPECT_EQ(std::memcmp(&one, &two, sizeof(double)), 0) << one << " vs " << two;
  }
}

TEST(SumSquares, PropagatesInfAndNaN) {
  VecF x = test::randn(100000, 810);
  x[77777] = INFINITY;
  EXPECT_EQ(sum_squares(x.data(), 100000), INFINITY);
  x[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(sum_squares(x.data(), 100000)));
  // A huge finite fp32 value squares fine in double (no overflow to inf as in fp32).
  VecF big = {3e38f, 1.0f};
  const double want = static_cast<double>(big[0]) * big[0] + 1.0;
  EXPECT_NEAR(sum_squares(big.data(), 2), want, 1e-15 * want);
  EXPECT_GT(want, 8.9e76);
}

TEST(Scale, MultipliesEveryElement) {
  const int64_t n = 70001;
  const VecF x = test::randn(n, 820);
  VecF y = x;
  scale(y.data(), 0.3f, n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], x[i] * 0.3f) << i;
}

}  // namespace
}  // namespace zerod::cpu
