#include "kernels/cpu/matmul.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.h"

namespace zerod::cpu {
namespace {

using test::VecD;
using test::VecF;

// out (N,OC) = inp (N,C) x weight (OC,C)^T + bias (OC, empty = none), in double.
VecD matmul_ref(const VecD& inp, const VecD& weight, const VecD& bias, int64_t N, int C, int OC) {
  VecD out(static_cast<size_t>(N) * OC);
  for (int64_t n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double s = bias.empty() ? 0.0 : bias[o];
      for (int c = 0; c < C; ++c) s += inp[n * C + c] * weight[static_cast<int64_t>(o) * C + c];
      out[n * OC + o] = s;
    }
  return out;
}

enum class DinpMode { kOverwrite, kAccumulate, kNull };

void check_matmul(int64_t N, int C, int OC, bool with_bias, DinpMode mode, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "N=" << N << " C=" << C << " OC=" << OC
                                  << " bias=" << with_bias << " mode=" << static_cast<int>(mode));
  const VecF inp = test::randn(N * C, seed);
  const VecF weight = test::randn(static_cast<int64_t>(OC) * C, seed + 1, 0.5f);
  const VecF bias = with_bias ? test::randn(OC, seed + 2) : VecF{};
  VecF out(N * OC, test::kNaN);  // = output: whatever it held must not matter
  matmul_forward(out.data(), inp.data(), weight.data(), with_bias ? bias.data() : nullptr, N, C,
                 OC);
  const VecD ind = test::to_double(inp), wd = test::to_double(weight), bd = test::to_double(bias);
  EXPECT_LT(test::rel_err(out, matmul_ref(ind, wd, bd, N, C, OC)), 2e-6);

  const VecF g = test::randn(N * OC, seed + 3);
  const VecD gd = test::to_double(g);
  const VecF dinp0 =
      mode == DinpMode::kAccumulate ? test::randn(N * C, seed + 4) : VecF(N * C, test::kNaN);
  const VecF dw0 = test::randn(static_cast<int64_t>(OC) * C, seed + 5);
  const VecF db0 = test::randn(OC, seed + 6);
  VecF dinp = dinp0, dw = dw0, db = db0;
  matmul_backward(mode == DinpMode::kNull ? nullptr : dinp.data(), dw.data(),
                  with_bias ? db.data() : nullptr, g.data(), inp.data(), weight.data(), N, C, OC,
                  mode == DinpMode::kAccumulate);

  auto f_inp = [&](const VecD& v) { return test::dot(gd, matmul_ref(v, wd, bd, N, C, OC)); };
  auto f_w = [&](const VecD& v) { return test::dot(gd, matmul_ref(ind, v, bd, N, C, OC)); };
  auto f_b = [&](const VecD& v) { return test::dot(gd, matmul_ref(ind, wd, v, N, C, OC)); };
  const auto iw = test::sample_indices(weight.size(), 300, seed);
  EXPECT_LT(test::rel_err(test::minus(dw, dw0), test::fd_gradient(f_w, wd, iw), iw), 1e-5);
  if (with_bias) {
    const auto ib = test::sample_indices(bias.size(), bias.size(), seed);
    EXPECT_LT(test::rel_err(test::minus(db, db0), test::fd_gradient(f_b, bd, ib)), 1e-5);
  } else {
    EXPECT_TRUE(test::bitwise_equal(db, db0));
  }
  const auto ii = test::sample_indices(inp.size(), 300, seed);
  const VecD g_inp = test::fd_gradient(f_inp, ind, ii);
  if (mode == DinpMode::kOverwrite) {
    EXPECT_LT(test::rel_err(dinp, g_inp, ii), 1e-5);
  } else if (mode == DinpMode::kAccumulate) {
    EXPECT_LT(test::rel_err(test::minus(dinp, dinp0), g_inp, ii), 1e-5);
  } else {
    for (float x : dinp) ASSERT_TRUE(std::isnan(x));  // untouched
  }
}

TEST(Matmul, ForwardAndBackwardMatchFiniteDifferences) {
  check_matmul(15, 11, 9, /*with_bias=*/true, DinpMode::kOverwrite, 100);
  check_matmul(15, 11, 9, /*with_bias=*/false, DinpMode::kOverwrite, 110);
  check_matmul(7, 13, 5, /*with_bias=*/true, DinpMode::kAccumulate, 120);
  check_matmul(7, 13, 5, /*with_bias=*/false, DinpMode::kAccumulate, 130);
  check_matmul(9, 5, 131, /*with_bias=*/true, DinpMode::kNull, 140);  // > one dbias block
  check_matmul(1, 1, 1, /*with_bias=*/true, DinpMode::kOverwrite, 150);
}

}  // namespace
}  // namespace zerod::cpu
