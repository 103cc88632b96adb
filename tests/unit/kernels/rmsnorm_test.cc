#include "kernels/cpu/rmsnorm.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.h"

namespace zerod::cpu {
namespace {

using test::VecD;
using test::VecF;

struct RmsRef {
  VecD out, rstd;
};

// Reference RMSNorm in double: rstd = 1/sqrt(mean(x^2) + eps), out = x * rstd * w.
RmsRef rmsnorm_ref(const VecD& x, const VecD& w, int64_t N, int C, double eps) {
  RmsRef r{VecD(x.size()), VecD(N)};
  for (int64_t n = 0; n < N; ++n) {
    double sq = 0.0;
    for (int c = 0; c < C; ++c) sq += x[n * C + c] * x[n * C + c];
    const double s = 1.0 / std::sqrt(sq / C + eps);
    for (int c = 0; c < C; ++c) r.out[n * C + c] = x[n * C + c] * s * w[c];
    r.rstd[n] = s;
  }
  return r;
}

void check_rmsnorm(int64_t N, int C, float eps, float x_scale, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "N=" << N << " C=" << C << " eps=" << eps
                                  << " x_scale=" << x_scale);
  // An offset, so the result differs from a layernorm's.
  const VecF x = test::randn(N * C, seed, x_scale, 0.5f * x_scale);
  const VecF w = test::randn(C, seed + 1, 0.5f, 1.0f);
  VecF out(N * C, test::kNaN), rstd(N, test::kNaN);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
  const VecD xd = test::to_double(x), wd = test::to_double(w);
  const RmsRef ref = rmsnorm_ref(xd, wd, N, C, eps);
  EXPECT_LT(test::rel_err(out, ref.out), 2e-6);
  EXPECT_LT(test::rel_err(rstd, ref.rstd), 2e-6);

  const VecF g = test::randn(N * C, seed + 3);
  const VecD gd = test::to_double(g);
  const VecF dx0 = test::randn(N * C, seed + 4), dw0 = test::randn(C, seed + 5);
  VecF dx = dx0, dw = dw0;  // += outputs start from random values
  rmsnorm_backward(dx.data(), dw.data(), g.data(), x.data(), w.data(), rstd.data(), N, C);

  auto f_x = [&](const VecD& v) { return test::dot(gd, rmsnorm_ref(v, wd, N, C, eps).out); };
  auto f_w = [&](const VecD& v) { return test::dot(gd, rmsnorm_ref(xd, v, N, C, eps).out); };
  const auto ix = test::sample_indices(x.size(), 400, seed);
  const auto iw = test::sample_indices(w.size(), w.size(), seed);
  const double h = 1e-5 * x_scale;  // a step relative to the inputs' size
  EXPECT_LT(test::rel_err(test::minus(dx, dx0), test::fd_gradient(f_x, xd, ix, h), ix), 2e-5);
  EXPECT_LT(test::rel_err(test::minus(dw, dw0), test::fd_gradient(f_w, wd, iw)), 2e-5);
}

TEST(RmsNorm, OddShapesMatchReferenceAndFiniteDifferences) {
  check_rmsnorm(/*N=*/3 * 7, /*C=*/13, 1e-5f, 1.0f, 10);
  check_rmsnorm(/*N=*/1, /*C=*/5, 1e-6f, 2.0f, 20);
  check_rmsnorm(/*N=*/3, /*C=*/2, 1e-6f, 1.0f, 25);
  // More rows than one reduction chunk (16 rows), C longer than a vector.
  check_rmsnorm(/*N=*/5 * 17, /*C=*/67, 1e-6f, 1.0f, 30);
  // Small inputs, where eps is a sizeable part of the mean square.
  check_rmsnorm(/*N=*/9, /*C=*/33, 1e-5f, 3e-3f, 40);
}

TEST(RmsNorm, EpsAndWeightEnterTheOutput) {
  const int64_t N = 2;
  const int C = 4;
  const VecF x = {1, -1, 1, -1, 2, 0, 0, 0};  // mean squares 1 and 1
  const VecF w = {1, 2, 3, 4};
  VecF out(N * C), rstd(N);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 0.25f);
  EXPECT_FLOAT_EQ(rstd[0], 1.0f / std::sqrt(1.25f));
  EXPECT_FLOAT_EQ(rstd[1], 1.0f / std::sqrt(1.25f));
  EXPECT_FLOAT_EQ(out[3], -4.0f / std::sqrt(1.25f));
  EXPECT_FLOAT_EQ(out[4], 2.0f / std::sqrt(1.25f));
  EXPECT_EQ(out[5], 0.0f);
}

}  // namespace
}  // namespace zerod::cpu
