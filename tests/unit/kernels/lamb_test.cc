// Lamb (kernels/cpu/lamb.h) against DeepSpeed FusedLamb's formula in torch ops:
// tests/unit/kernels/lamb_reference.py (Debian's python3 with python3-torch) writes the inputs and
// the results of 10 steps on six tensors of different sizes and scales (weight decay on, two
// parameter sets); the weights, both moments and every step's trust ratio must agree within 1e-6
// relative, and the cases must reach the clamp at max_coeff and at min_coeff and the ratio 1 of a
// zero norm.
#include "kernels/cpu/lamb.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/optim.h"
#include "torch_reference.h"

namespace zerod::cpu {
namespace {

using Json = nlohmann::json;

const Json& references() {
  static const Json refs = testing::run_torch_reference("lamb_reference.py");
  return refs;
}

OptimizerParams params_of(const Json& q) {
  OptimizerParams p;
  p.kind = OptimizerKind::kLamb;
  p.lr = q["lr"];
  p.beta1 = q["betas"][0];
  p.beta2 = q["betas"][1];
  p.eps = q["eps"];
  p.eps_inside_sqrt = q["eps_inside_sqrt"];
  p.weight_decay = q["weight_decay"];
  p.bias_correction = q["bias_correction"];
  p.max_coeff = q["max_coeff"];
  p.min_coeff = q["min_coeff"];
  return p;
}

struct Tensor {
  std::vector<float> master, m, v;
  std::vector<double> coeffs;
};

// One step of one tensor: pass 1 over its pieces (sums added), the ratio, pass 2 over the pieces.
using StepFn = void (*)(Tensor& t, const std::vector<float>& g, const OptimizerParams& p);

void whole(Tensor& t, const std::vector<float>& g, const OptimizerParams& p) {
  const int64_t n = static_cast<int64_t>(t.master.size());
  const Backend::LambSums s = lamb_moments(t.master.data(), t.m.data(), t.v.data(), g.data(), n, p);
  const float c = lamb_coeff(s.w2, s.u2, lamb_constants(p));
  lamb_apply(t.master.data(), t.m.data(), t.v.data(), nullptr, n, p, c, DType::kF32);
  t.coeffs.push_back(c);
}

// Through the backend in two pieces cut at an odd point (as a ZeRO shard boundary cuts a tensor),
// the gradients x4 with grad_scale 1/4 (a loss scale), and the rounded copy written.
void in_pieces(Tensor& t, const std::vector<float>& g, const OptimizerParams& p0) {
  static const std::unique_ptr<Backend> be = make_cpu_backend(DType::kF32);
  OptimizerParams p = p0;
  p.grad_scale = 0.25f;
  const int64_t n = static_cast<int64_t>(t.master.size()), cut = n / 3;
  std::vector<float> g4(g), out(g.size(), -1.0f);
  for (float& x : g4) x *= 4.0f;
  Backend::LambSums s;
  for (auto [a, b] : {std::pair<int64_t, int64_t>{0, cut}, {cut, n}}) {
    const Backend::LambSums q = be->lamb_moments(t.master.data() + a, t.m.data() + a,
                                                 t.v.data() + a, g4.data() + a, b - a, p);
    s.w2 += q.w2;
    s.u2 += q.u2;
  }
  const float c = lamb_coeff(s.w2, s.u2, lamb_constants(p));
  for (auto [a, b] : {std::pair<int64_t, int64_t>{0, cut}, {cut, n}})
    be->lamb_apply(t.master.data() + a, t.m.data() + a, t.v.data() + a, out.data() + a, b - a, p,
                   c);
  EXPECT_EQ(out, t.master) << "param_out is the new master";
  t.coeffs.push_back(c);
}

void check_against_torch(StepFn step) {
  const Json& refs = references();
  ASSERT_TRUE(refs.contains("cases"))
      << "tests/unit/kernels/lamb_reference.py failed: it needs /usr/bin/python3 with torch "
         "(python3-torch, tools/deps.sh)";
  ASSERT_EQ(refs["cases"].size(), 2u);
  int at_max = 0, at_min = 0, zero_norm = 0;
  for (const Json& c : refs["cases"]) {
    const OptimizerParams p0 = params_of(c["params"]);
    ASSERT_EQ(c["tensors"].size(), 6u);
    for (const Json& r : c["tensors"]) {
      const std::string what = r["name"].get<std::string>() + " " + c["params"].dump();
      Tensor t{r["p0"].get<std::vector<float>>(), {}, {}, {}};
      t.m.assign(t.master.size(), 0.0f);
      t.v.assign(t.master.size(), 0.0f);
      int64_t s = 0;
      for (const Json& g : r["grads"]) {
        OptimizerParams p = p0;
        p.step = ++s;
        step(t, g.get<std::vector<float>>(), p);
      }
      EXPECT_EQ(s, 10) << what;
      testing::expect_close_to_reference(t.master, r["p"], what + " weights");
      testing::expect_close_to_reference(t.m, r["m"], what + " exp_avg");
      testing::expect_close_to_reference(t.v, r["v"], what + " exp_avg_sq");
      testing::expect_close_to_reference(t.coeffs, r["coeffs"], what + " trust ratios");
      for (size_t i = 0; i < t.coeffs.size(); ++i) {
        at_max += t.coeffs[i] == static_cast<float>(p0.max_coeff);
        at_min += t.coeffs[i] == static_cast<float>(p0.min_coeff);
        zero_norm +=
            t.coeffs[i] == 1.0f && (r["name"] == "dead" || (r["name"] == "zero" && i == 0));
      }
    }
  }
  EXPECT_GE(at_max, 20) << "the clamp at max_coeff";
  EXPECT_GE(at_min, 20) << "the clamp at min_coeff";
  EXPECT_EQ(zero_norm, 22) << "ratio 1 where a norm is 0";
}

TEST(Lamb, MatchesDeepSpeedFusedLambFormulaOverTenSteps) {
  check_against_torch(whole);
}

TEST(Lamb, PiecesThroughTheBackendWithGradScaleMatchToo) {
  check_against_torch(in_pieces);
}

// The ratio: 1 when either norm is 0, else ||w|| / ||u|| in fp32 clamped (max first, then min).
TEST(Lamb, TrustRatioClampAndZeroNorms) {
  OptimizerParams p;
  p.kind = OptimizerKind::kLamb;
  p.max_coeff = 10.0;
  p.min_coeff = 0.01;
  const LambConstants k = lamb_constants(p);
  EXPECT_EQ(lamb_coeff(0.0, 4.0, k), 1.0f);
  EXPECT_EQ(lamb_coeff(4.0, 0.0, k), 1.0f);
  EXPECT_EQ(lamb_coeff(0.0, 0.0, k), 1.0f);
  EXPECT_EQ(lamb_coeff(9.0, 4.0, k), 1.5f);
  EXPECT_EQ(lamb_coeff(1e6, 1.0, k), 10.0f);
  EXPECT_EQ(lamb_coeff(1.0, 1e6, k), 0.01f);
  // A one-pass optimizer_update refuses Lamb.
  float x = 0;
  EXPECT_THROW(optimizer_update(&x, &x, &x, &x, nullptr, 1, p, DType::kF32), zerod::Error);
}

}  // namespace
}  // namespace zerod::cpu
