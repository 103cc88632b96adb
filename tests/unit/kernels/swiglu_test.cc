#include "kernels/cpu/swiglu.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.h"

namespace zerod::cpu {
namespace {

using test::VecD;
using test::VecF;

// out[n,i] = silu(gu[n,i]) * gu[n,I+i] in double.
VecD swiglu_ref(const VecD& gu, int64_t N, int I) {
  VecD out(static_cast<size_t>(N) * I);
  for (int64_t n = 0; n < N; ++n)
    for (int i = 0; i < I; ++i) {
      const double g = gu[n * 2 * I + i], u = gu[n * 2 * I + I + i];
      out[n * I + i] = g / (1.0 + std::exp(-g)) * u;
    }
  return out;
}

void check_swiglu(int64_t N, int I, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "N=" << N << " I=" << I);
  const VecF gu = test::randn(N * 2 * I, seed, 2.0f);
  VecF out(N * I, test::kNaN);
  swiglu_forward(out.data(), gu.data(), N, I);
  const VecD gud = test::to_double(gu);
  EXPECT_LT(test::rel_err(out, swiglu_ref(gud, N, I)), 2e-6);

  const VecF g = test::randn(N * I, seed + 1);
  const VecD gd = test::to_double(g);
  VecF dgu(gu.size(), test::kNaN);  // = output
  swiglu_backward(dgu.data(), g.data(), gu.data(), N, I);
  auto f = [&](const VecD& x) { return test::dot(gd, swiglu_ref(x, N, I)); };
  const auto idx = test::sample_indices(gu.size(), gu.size(), seed);
  const VecD want = test::fd_gradient(f, gud, idx);
  // Gate and up columns separately: a wrong half cannot hide behind the other.
  std::vector<size_t> gate, up;
  for (int64_t n = 0; n < N; ++n)
    for (int i = 0; i < 2 * I; ++i) (i < I ? gate : up).push_back(n * 2 * I + i);
  EXPECT_LT(test::rel_err(dgu, want, gate), 1e-5);
  EXPECT_LT(test::rel_err(dgu, want, up), 1e-5);

  // In place (dgu over gu) gives the same values.
  VecF inplace = gu;
  swiglu_backward(inplace.data(), g.data(), inplace.data(), N, I);
  EXPECT_TRUE(test::bitwise_equal(inplace, dgu));
}

TEST(SwiGlu, OddShapesMatchReferenceAndFiniteDifferences) {
  check_swiglu(/*N=*/1, /*I=*/1, 10);
  check_swiglu(/*N=*/7, /*I=*/13, 20);
  check_swiglu(/*N=*/33, /*I=*/100, 30);
}

TEST(SwiGlu, LargeGatesStayFinite) {
  const VecF gu = {-200.0f, -30.0f, 0.0f, 30.0f, 200.0f,  // gate
                   1.0f,    2.0f,   3.0f, 4.0f,  5.0f};   // up
  VecF out(5), dgu(10);
  swiglu_forward(out.data(), gu.data(), 1, 5);
  const VecF ones(5, 1.0f);
  swiglu_backward(dgu.data(), ones.data(), gu.data(), 1, 5);
  for (float v : out) EXPECT_TRUE(std::isfinite(v));
  for (float v : dgu) EXPECT_TRUE(std::isfinite(v));
  EXPECT_NEAR(out[0], 0.0f, 1e-30f);
  EXPECT_NEAR(out[1], -30.0f * 2.0f / (1.0f + std::exp(30.0f)), 1e-15f);
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_FLOAT_EQ(out[3], 30.0f * 4.0f);
  EXPECT_FLOAT_EQ(out[4], 200.0f * 5.0f);
  EXPECT_FLOAT_EQ(dgu[2], 0.5f * 3.0f);  // silu'(0) = 1/2
  EXPECT_FLOAT_EQ(dgu[4], 5.0f);         // silu'(x) -> 1
  EXPECT_EQ(dgu[5], 0.0f);               // dup = silu(-200) = 0
  EXPECT_FLOAT_EQ(dgu[9], 200.0f);
}

}  // namespace
}  // namespace zerod::cpu
