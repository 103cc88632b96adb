#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/residual.h"

namespace zerod::cpu {
namespace {

using test::VecD;
using test::VecF;

double gelu_ref(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

VecF gelu_inputs(int64_t n, uint64_t seed) {
  VecF x = test::randn(n, seed, 2.5f);
  // Specific points: zero, tiny, the tails where tanh saturates.
  const float special[] = {0.0f, -0.0f, 1e-6f, -1e-6f, 1e-3f, 8.0f, -8.0f, 20.0f, -20.0f, 3.0f};
  for (size_t i = 0; i < std::size(special) && i < x.size(); ++i) x[i] = special[i];
  return x;
}

TEST(Gelu, ForwardMatchesReference) {
  const VecF x = gelu_inputs(1001, 300);
  VecF out(x.size());
  gelu_forward(out.data(), x.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = gelu_ref(x[i]);
    // fp32 evaluation: relative ~1e-6, plus an absolute floor for the tanh cancellation at x<0.
    ASSERT_NEAR(out[i], want, 2e-6 * std::fabs(want) + 1e-7 * std::fabs(x[i]) + 1e-30)
        << "x=" << x[i];
  }
}

TEST(Gelu, BackwardMatchesFiniteDifferences) {
  const int64_t n = 1001;
  const VecF x = gelu_inputs(n, 310);
  const VecF g = test::randn(n, 311);
  VecF dx(n, test::kNaN);  // = output
  gelu_backward(dx.data(), x.data(), g.data(), n);
  // The op is element-wise, so the gradient of sum(g * gelu(x)) is a per-element derivative.
  VecD want(n);
  const double h = 1e-5;
  for (int64_t i = 0; i < n; ++i)
    want[i] = g[i] * (gelu_ref(x[i] + h) - gelu_ref(x[i] - h)) / (2 * h);
  for (int64_t i = 0; i < n; ++i)
    ASSERT_NEAR(dx[i], want[i], 2e-6 * std::fabs(g[i]) + 2e-6 * std::fabs(want[i])) << "x=" << x[i];

  // In place (dinp aliases dout) gives the same bits.
  VecF inplace = g;
  gelu_backward(inplace.data(), x.data(), inplace.data(), n);
  EXPECT_TRUE(test::bitwise_equal(inplace, dx));
}

TEST(Gelu, PropagatesNaNAndInfinity) {
  const VecF x = {test::kNaN, INFINITY, -INFINITY};
  VecF out(3);
  gelu_forward(out.data(), x.data(), 3);
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_EQ(out[1], INFINITY);
  EXPECT_TRUE(std::isnan(out[2]) || out[2] == 0.0f);  // -inf * 0: the math is undefined
}

TEST(Residual, AddsExactlyAndInPlace) {
  const int64_t n = 1003;
  const VecF a = test::randn(n, 320), b = test::randn(n, 321, 3.0f);
  VecF out(n);
  residual_forward(out.data(), a.data(), b.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    // a + b in double is exact; the fp32 sum is its correct rounding.
    ASSERT_EQ(out[i], static_cast<float>(static_cast<double>(a[i]) + b[i]));
  }
  VecF acc = a;
  residual_forward(acc.data(), acc.data(), b.data(), n);
  EXPECT_TRUE(test::bitwise_equal(acc, out));
}

}  // namespace
}  // namespace zerod::cpu
