#include "kernels/cpu/adamw.h"

#include "core/cpu_info.h"
#include "core/error.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/dtype.h"
#include "kernel_test_util.h"

namespace zerod::cpu {
namespace {

using test::VecF;

struct State {
  VecF p, m, v, g;
};

State make_state(int64_t n, uint64_t seed) {
  State s{test::randn(n, seed), test::randn(n, seed + 1, 0.1f), test::randn(n, seed + 2, 0.1f),
          test::randn(n, seed + 3)};
  for (auto& x : s.v) x = x * x;  // second moments are non-negative
  return s;
}

// The step in double, written from the formula (DeepSpeed FusedAdam), with error bounds for the
// fp32 kernel derived from a few ulps per operation.
struct RefResult {
  double p, m, v, tol_p, tol_m, tol_v;
};

RefResult adamw_ref(double p, double m, double v, double grad, const AdamWParams& P) {
  const double b1 = P.beta1, b2 = P.beta2, wd = P.weight_decay, lr = P.lr;
  const bool decay = P.weight_decay != 0.0f;
  double g = grad * static_cast<double>(P.grad_scale);
  if (!P.adam_w_mode && decay) g += wd * p;
  const double m1 = b1 * m + (1.0 - b1) * g;
  const double v1 = b2 * v + (1.0 - b2) * g * g;
  const double bc1 = P.bias_correction ? 1.0 - std::pow(b1, static_cast<double>(P.step)) : 1.0;
  const double bc2 = P.bias_correction ? 1.0 - std::pow(b2, static_cast<double>(P.step)) : 1.0;
  const double denom = std::sqrt(v1) / std::sqrt(bc2) + P.eps;
  double update = (m1 / bc1) / denom;
  if (P.adam_w_mode && decay) update += wd * p;
  const double p1 = p - lr * update;

  constexpr double kU = 6e-8;  // one fp32 ulp, relative
  RefResult r{p1, m1, v1, 0, 0, 0};
  r.tol_m = 4 * kU * (std::fabs(b1 * m) + std::fabs((1.0 - b1) * g) + std::fabs(wd * p));
  r.tol_v = 4 * kU * (b2 * v + (1.0 - b2) * g * g) + 1e-45;
  const double upd_err = std::fabs(m1 / bc1 / denom) * (4 * kU + 0.5 * r.tol_v / (v1 + 1e-45)) +
                         r.tol_m / (bc1 * denom) + 2 * kU * std::fabs(update);
  r.tol_p = 2 * kU * std::fabs(p) + lr * upd_err + 2 * kU * lr * std::fabs(update);
  return r;
}

void check_step(const AdamWParams& P, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "adam_w_mode=" << P.adam_w_mode
                                  << " bias_correction=" << P.bias_correction
                                  << " wd=" << P.weight_decay << " step=" << P.step);
  const int64_t n = 103;  // not a multiple of the 16 vector lanes: exercises the tail
  const State s0 = make_state(n, seed);
  State s = s0;
  VecF out(n, test::kNaN);
  adamw_update(s.p.data(), s.m.data(), s.v.data(), s.g.data(), out.data(), n, P, DType::kF32);
  int64_t large_steps = 0;
  for (int64_t i = 0; i < n; ++i) {
    const RefResult r = adamw_ref(s0.p[i], s0.m[i], s0.v[i], s0.g[i], P);
    ASSERT_NEAR(s.m[i], r.m, r.tol_m) << i;
    ASSERT_NEAR(s.v[i], r.v, r.tol_v) << i;
    ASSERT_NEAR(s.p[i], r.p, r.tol_p) << i;
    large_steps += std::fabs(r.p - s0.p[i]) > 100 * r.tol_p;
  }
  // Steps are large compared with the tolerance, so a wrong formula cannot hide in it.
  EXPECT_GT(large_steps, n * 9 / 10);
  EXPECT_TRUE(test::bitwise_equal(out, s.p));  // fp32 param_out is a copy of the master
}

TEST(AdamW, MatchesDoubleFormulaInEveryMode) {
  uint64_t seed = 500;
  for (bool w_mode : {true, false})
    for (bool bc : {true, false})
      for (float wd : {0.0f, 0.1f})
        for (int64_t step : {1, 7}) {
          AdamWParams P;
          P.lr = 1e-2f;
          P.beta1 = 0.9f;
          P.beta2 = 0.95f;
          P.eps = 1e-8f;
          P.weight_decay = wd;
          P.adam_w_mode = w_mode;
          P.bias_correction = bc;
          P.step = step;
          P.grad_scale = 0.5f;
          check_step(P, seed);
          seed += 10;
        }
}

// The paths this CPU can run (the scalar one always).
std::vector<AdamIsa> available_isas() {
  std::vector<AdamIsa> out = {AdamIsa::kScalar};
  if (cpu_info().avx2 && cpu_info().fma) out.push_back(AdamIsa::kAvx2);
  if (cpu_info().avx512f) out.push_back(AdamIsa::kAvx512);
  return out;
}

// Every vector path of adamw_update_span (AVX-512, AVX2, chosen at run time) equals the scalar
// definition adamw_element bit for bit, which is what the CPU-offload optimizer relies on.
template <bool kL2, bool kDecoupled>
void check_span_matches_element(const AdamWParams& P) {
  const int64_t n = 16 * 5 + 7;
  const State s0 = make_state(n, 600);
  const AdamWConstants k = adamw_constants(P);
  ASSERT_EQ(k.l2_decay, kL2);
  ASSERT_EQ(k.decoupled_decay, kDecoupled);
  State b = s0;
  for (int64_t i = 0; i < n; ++i) adamw_element<kL2, kDecoupled>(b.p[i], b.m[i], b.v[i], b.g[i], k);
  for (const AdamIsa isa : available_isas()) {
    set_adamw_isa(isa);
    ASSERT_EQ(adamw_isa(), isa);
    State a = s0;
    adamw_update_span(a.p.data(), a.m.data(), a.v.data(), a.g.data(), n, k);
    EXPECT_TRUE(test::bitwise_equal(a.p, b.p)) << adamw_isa_name(isa);
    EXPECT_TRUE(test::bitwise_equal(a.m, b.m)) << adamw_isa_name(isa);
    EXPECT_TRUE(test::bitwise_equal(a.v, b.v)) << adamw_isa_name(isa);
  }
  set_adamw_isa(AdamIsa::kAuto);
}

TEST(AdamW, VectorLoopEqualsScalarElementBitwise) {
  AdamWParams P;
  P.lr = 3e-3f;
  P.step = 5;
  P.grad_scale = 0.25f;
  P.weight_decay = 0.1f;
  P.adam_w_mode = false;
  check_span_matches_element<true, false>(P);
  P.adam_w_mode = true;
  check_span_matches_element<false, true>(P);
  P.weight_decay = 0.0f;
  check_span_matches_element<false, false>(P);
}

TEST(AdamW, TheRunTimeChoiceFollowsTheCpuAndRefusesWhatItLacks) {
  set_adamw_isa(AdamIsa::kAuto);
  const AdamIsa best = cpu_info().avx512f                    ? AdamIsa::kAvx512
                       : (cpu_info().avx2 && cpu_info().fma) ? AdamIsa::kAvx2
                                                             : AdamIsa::kScalar;
  EXPECT_EQ(adamw_isa(), best);
  if (!cpu_info().avx512f) {
    EXPECT_THROW(set_adamw_isa(AdamIsa::kAvx512), InputError);
  }
}

TEST(AdamW, ParamOutIsTheRoundedMaster) {
  AdamWParams P;
  P.lr = 1e-2f;
  P.weight_decay = 0.1f;
  const int64_t n = 4099;  // more than one internal block of 4096
  for (DType dt : {DType::kBF16, DType::kF16}) {
    const State s0 = make_state(n, 700);
    State s = s0, t = s0;
    VecF out(n, test::kNaN);
    adamw_update(s.p.data(), s.m.data(), s.v.data(), s.g.data(), out.data(), n, P, dt);
    adamw_update(t.p.data(), t.m.data(), t.v.data(), t.g.data(), nullptr, n, P, dt);
    EXPECT_TRUE(test::bitwise_equal(s.p, t.p));  // the master stays fp32, param_out or not
    int differs = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float want = dt == DType::kBF16 ? round_bf16(s.p[i]) : round_f16(s.p[i]);
      ASSERT_EQ(out[i], want) << i;
      differs += out[i] != s.p[i];
    }
    EXPECT_GT(differs, n / 2);  // the rounding really happened
  }
}

TEST(AdamW, RejectsStepZeroWithBiasCorrection) {
  AdamWParams P;
  P.step = 0;
  EXPECT_ANY_THROW(adamw_constants(P));
  P.bias_correction = false;
  EXPECT_NO_THROW(adamw_constants(P));
}

}  // namespace
}  // namespace zerod::cpu
