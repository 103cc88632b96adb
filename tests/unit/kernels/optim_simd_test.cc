// The vector paths of SGD, Adagrad, Lion and Lamb (kernels/cpu/optim_simd.h: AVX-512 and AVX2,
// picked at run time like CPU Adam's) equal the scalar element definitions bit for bit, through
// the entry points the CPU backend and the CPU-offload optimizer call (optimizer_update,
// lamb_moments, lamb_apply), over several blocks with a tail, at the first step and later, with
// a gradient scale, zeros (Lion's sign of 0), and Lamb's eps inside and outside the root.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/cpu_info.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cpu/lamb.h"
#include "kernels/cpu/optim.h"
#include "tests/unit/kernels/kernel_test_util.h"

namespace zerod::cpu {
namespace {

struct State {
  std::vector<float> p, m, v, g, out;
};

// Two blocks of 4096 and a tail of 37 (not a multiple of 8 or 16); a few exact zeros.
State make_state(uint32_t seed) {
  const size_t n = 2 * 4096 + 37;
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  State s;
  for (size_t i = 0; i < n; ++i) {
    s.p.push_back(d(rng));
    s.m.push_back(0.1f * d(rng));
    s.v.push_back(std::abs(0.01f * d(rng)));
    s.g.push_back(i % 97 == 0 ? 0.0f : d(rng));
  }
  for (size_t i = 0; i < n; i += 101) s.m[i] = 0.0f;  // with g 0 too: Lion's c is exactly 0
  s.out.assign(n, 0.0f);
  return s;
}

std::vector<AdamIsa> available_isas() {
  std::vector<AdamIsa> out = {AdamIsa::kScalar};
  if (cpu_info().avx2 && cpu_info().fma) out.push_back(AdamIsa::kAvx2);
  if (cpu_info().avx512f) out.push_back(AdamIsa::kAvx512);
  return out;
}

// Three steps of `p` (the first, then two more) on every path; each must equal the scalar's.
template <class Step>
void expect_every_path_equal(const std::string& what, const Step& step) {
  const State s0 = make_state(17);
  set_adamw_isa(AdamIsa::kScalar);
  State want = s0;
  for (int64_t t = 1; t <= 3; ++t) step(want, t);
  for (const AdamIsa isa : available_isas()) {
    set_adamw_isa(isa);
    State got = s0;
    for (int64_t t = 1; t <= 3; ++t) step(got, t);
    const std::string where = what + " on " + adamw_isa_name(isa);
    EXPECT_TRUE(test::bitwise_equal(got.p, want.p)) << where << ": weights";
    EXPECT_TRUE(test::bitwise_equal(got.m, want.m)) << where << ": m";
    EXPECT_TRUE(test::bitwise_equal(got.v, want.v)) << where << ": v";
    EXPECT_TRUE(test::bitwise_equal(got.out, want.out)) << where << ": rounded weights";
  }
  set_adamw_isa(AdamIsa::kAuto);
}

TEST(OptimizerVectorPaths, SgdAdagradLionEqualTheScalarElementsBitwise) {
  OptimizerParams base;
  base.lr = 0.05;
  base.weight_decay = 0.01;
  base.grad_scale = 0.5f;
  struct Case {
    std::string name;
    OptimizerParams p;
  };
  std::vector<Case> cases;
  OptimizerParams sgd = base;
  sgd.kind = OptimizerKind::kSgd;
  cases.push_back({"SGD", sgd});
  sgd.momentum = 0.9;
  sgd.dampening = 0.1;
  cases.push_back({"SGD momentum dampening", sgd});
  sgd.dampening = 0.0;
  sgd.nesterov = true;
  cases.push_back({"SGD nesterov", sgd});
  OptimizerParams ada = base;
  ada.kind = OptimizerKind::kAdagrad;
  ada.lr_decay = 0.01;
  ada.initial_accumulator_value = 0.1;
  ada.eps = 1e-10;
  cases.push_back({"Adagrad", ada});
  OptimizerParams lion = base;
  lion.kind = OptimizerKind::kLion;
  lion.beta1 = 0.9;
  lion.beta2 = 0.99;
  cases.push_back({"Lion", lion});
  for (const Case& c : cases) {
    expect_every_path_equal(c.name, [&](State& s, int64_t t) {
      OptimizerParams p = c.p;
      p.step = t;
      optimizer_update(s.p.data(), s.m.data(), s.v.data(), s.g.data(), s.out.data(),
                       static_cast<int64_t>(s.p.size()), p, DType::kBF16);
    });
  }
}

TEST(OptimizerVectorPaths, LambPassesEqualTheScalarElementsBitwise) {
  for (const bool inside : {false, true}) {
    OptimizerParams p;
    p.kind = OptimizerKind::kLamb;
    p.lr = 1e-2;
    p.beta1 = 0.9;
    p.beta2 = 0.999;
    p.eps = 1e-6;
    p.weight_decay = 0.01;
    p.grad_scale = 0.25f;
    p.max_coeff = 10.0;
    p.min_coeff = 0.01;
    p.eps_inside_sqrt = inside;
    std::vector<Backend::LambSums> sums;
    const std::string what = inside ? "Lamb, eps inside the root" : "Lamb";
    expect_every_path_equal(what, [&](State& s, int64_t t) {
      p.step = t;
      const int64_t n = static_cast<int64_t>(s.p.size());
      const Backend::LambSums q =
          lamb_moments(s.p.data(), s.m.data(), s.v.data(), s.g.data(), n, p);
      sums.push_back(q);
      const float coeff = lamb_coeff(q.w2, q.u2, lamb_constants(p));
      lamb_apply(s.p.data(), s.m.data(), s.v.data(), s.out.data(), n, p, coeff, DType::kF32);
    });
    // The sums of squares (and so the trust ratios) are the scalar path's exactly.
    const size_t steps = 3, paths = sums.size() / steps;
    ASSERT_EQ(sums.size(), steps * paths);
    for (size_t i = steps; i < sums.size(); ++i) {
      EXPECT_EQ(sums[i].w2, sums[i % steps].w2) << what << " path " << i / steps;
      EXPECT_EQ(sums[i].u2, sums[i % steps].u2) << what << " path " << i / steps;
    }
  }
}

}  // namespace
}  // namespace zerod::cpu
