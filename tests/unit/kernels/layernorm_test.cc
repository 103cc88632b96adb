#include "kernels/cpu/layernorm.h"

#include <gtest/gtest.h>

#include "kernel_test_util.h"

namespace zerod::cpu {
namespace {

using test::VecD;
using test::VecF;

struct LnRef {
  VecD out, mean, rstd;
};

// Reference layernorm in double: biased variance, eps 1e-5.
LnRef layernorm_ref(const VecD& x, const VecD& w, const VecD& b, int64_t N, int C) {
  LnRef r{VecD(x.size()), VecD(N), VecD(N)};
  for (int64_t n = 0; n < N; ++n) {
    double m = 0.0;
    for (int c = 0; c < C; ++c) m += x[n * C + c];
    m /= C;
    double v = 0.0;
    for (int c = 0; c < C; ++c) v += (x[n * C + c] - m) * (x[n * C + c] - m);
    v /= C;
    const double s = 1.0 / std::sqrt(v + 1e-5);
    for (int c = 0; c < C; ++c) r.out[n * C + c] = (x[n * C + c] - m) * s * w[c] + b[c];
    r.mean[n] = m;
    r.rstd[n] = s;
  }
  return r;
}

void check_layernorm(int64_t N, int C, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "N=" << N << " C=" << C);
  // Rows with an offset and a spread unlike N(0,1), so mean and variance both matter.
  VecF x = test::randn(N * C, seed, 2.0f, 0.7f);
  const VecF w = test::randn(C, seed + 1, 0.5f, 1.0f);
  const VecF b = test::randn(C, seed + 2, 0.3f);
  VecF out(N * C), mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  const VecD xd = test::to_double(x), wd = test::to_double(w), bd = test::to_double(b);
  const LnRef ref = layernorm_ref(xd, wd, bd, N, C);
  EXPECT_LT(test::rel_err(out, ref.out), 2e-6);
  EXPECT_LT(test::rel_err(mean, ref.mean), 2e-6);
  EXPECT_LT(test::rel_err(rstd, ref.rstd), 2e-6);

  const VecF g = test::randn(N * C, seed + 3);
  const VecD gd = test::to_double(g);
  const VecF dx0 = test::randn(N * C, seed + 4), dw0 = test::randn(C, seed + 5),
             db0 = test::randn(C, seed + 6);
  VecF dx = dx0, dw = dw0, db = db0;
  layernorm_backward(dx.data(), dw.data(), db.data(), g.data(), x.data(), w.data(), mean.data(),
                     rstd.data(), N, C);

  auto f_x = [&](const VecD& v) { return test::dot(gd, layernorm_ref(v, wd, bd, N, C).out); };
  auto f_w = [&](const VecD& v) { return test::dot(gd, layernorm_ref(xd, v, bd, N, C).out); };
  auto f_b = [&](const VecD& v) { return test::dot(gd, layernorm_ref(xd, wd, v, N, C).out); };
  const auto ix = test::sample_indices(x.size(), 400, seed);
  const auto iw = test::sample_indices(w.size(), w.size(), seed);
  // fp32 gradients of sums over C (rows) and N (weights): observed errors ~1e-6.
  EXPECT_LT(test::rel_err(test::minus(dx, dx0), test::fd_gradient(f_x, xd, ix), ix), 2e-5);
  EXPECT_LT(test::rel_err(test::minus(dw, dw0), test::fd_gradient(f_w, wd, iw)), 2e-5);
  EXPECT_LT(test::rel_err(test::minus(db, db0), test::fd_gradient(f_b, bd, iw)), 2e-5);
}

TEST(LayerNorm, OddShapesMatchReferenceAndFiniteDifferences) {
  check_layernorm(/*N=*/3 * 7, /*C=*/13, 10);
  check_layernorm(/*N=*/1, /*C=*/5, 20);
  // More rows than one reduction chunk (16 rows), C longer than a vector.
  check_layernorm(/*N=*/5 * 17, /*C=*/67, 30);
}

}  // namespace
}  // namespace zerod::cpu
