// SGD, Adagrad and Lion (kernels/cpu/optim.h) against torch.optim.SGD, torch.optim.Adagrad and
// Lion's formula in torch ops: tests/unit/kernels/optim_reference.py (Debian's python3 with
// python3-torch) writes the inputs and torch's results of 10 steps on random fp32 tensors with
// gradients that change every step and weight decay on; the kernel must agree within 1e-6
// relative, in the weights and in the optimizer state.
#include "kernels/cpu/optim.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "torch_reference.h"

#include "tests/unit/kernels/torch_reference.h"

namespace zerod::cpu {
namespace {

using Json = nlohmann::json;

// The references, made once per test program.
const Json& references() {
  static const Json refs = testing::run_torch_reference("optim_reference.py");
  return refs;
}

OptimizerParams params_of(const Json& c) {
  const std::string type = c["type"];
  const Json& q = c["params"];
  OptimizerParams p;
  p.kind = type == "SGD"       ? OptimizerKind::kSgd
           : type == "Adagrad" ? OptimizerKind::kAdagrad
                               : OptimizerKind::kLion;
  p.lr = q.value("lr", 0.0);
  p.weight_decay = q.value("weight_decay", 0.0);
  p.momentum = q.value("momentum", 0.0);
  p.dampening = q.value("dampening", 0.0);
  p.nesterov = q.value("nesterov", false);
  p.lr_decay = q.value("lr_decay", 0.0);
  p.initial_accumulator_value = q.value("initial_accumulator_value", 0.0);
  p.eps = q.value("eps", 1e-10);
  if (q.contains("betas")) {
    p.beta1 = q["betas"][0];
    p.beta2 = q["betas"][1];
  }
  return p;
}

// Runs every case through `step` (one optimizer step of all elements) and compares with torch.
template <class Step>
void check_against_torch(const Step& step) {
  const Json& refs = references();
  ASSERT_TRUE(refs.contains("cases"))
      << "tests/unit/kernels/optim_reference.py failed: it needs /usr/bin/python3 with torch "
         "(python3-torch, tools/deps.sh)";
  ASSERT_EQ(refs["cases"].size(), 8u);
  for (const Json& c : refs["cases"]) {
    const std::string what = c["type"].get<std::string>() + " " + c["params"].dump();
    OptimizerParams p = params_of(c);
    std::vector<float> master = c["p0"].get<std::vector<float>>();
    std::vector<float> m(master.size(), 0.0f), v(master.size(), 0.0f);
    int64_t s = 0;
    for (const Json& g : c["grads"]) {
      p.step = ++s;
      step(master, m, v, g.get<std::vector<float>>(), p);
    }
    EXPECT_EQ(s, 10) << what;
    testing::expect_close_to_reference(master, c["p"], what + " weights");
    if (c.contains("m"))
      testing::expect_close_to_reference(m, c["m"], what + " m (momentum buffer / exp_avg)");
    if (c.contains("v")) testing::expect_close_to_reference(v, c["v"], what + " v (sum)");
  }
}

TEST(Optimizers, SgdAdagradLionMatchTorchOverTenSteps) {
  check_against_torch([](std::vector<float>& master, std::vector<float>& m, std::vector<float>& v,
                         const std::vector<float>& g, const OptimizerParams& p) {
    optimizer_update(master.data(), m.data(), v.data(), g.data(), nullptr,
                     static_cast<int64_t>(master.size()), p, DType::kF32);
  });
}

// Through the backend, with the gradients scaled by 4 and grad_scale 1/4 (a loss scale), and the
// rounded copy of the new weights written.
TEST(Optimizers, BackendStepWithGradScaleMatchesTorch) {
  auto be = make_cpu_backend(DType::kF32);
  check_against_torch([&](std::vector<float>& master, std::vector<float>& m, std::vector<float>& v,
                          const std::vector<float>& g, const OptimizerParams& p0) {
    OptimizerParams p = p0;
    p.grad_scale = 0.25f;
    std::vector<float> g4(g.size()), out(g.size());
    for (size_t i = 0; i < g.size(); ++i) g4[i] = g[i] * 4.0f;  // exact
    be->optimizer_update(master.data(), m.data(), v.data(), g4.data(), out.data(),
                         static_cast<int64_t>(master.size()), p);
    EXPECT_EQ(out, master);
  });
}

// Pieces of any size (the CPU-offload optimizer's sub-groups) give the same bits as one call.
TEST(Optimizers, PiecesGiveTheBitsOfOneCall) {
  const int64_t n = 70000;  // above the parallel threshold
  std::vector<float> g(n), p0(n);
  for (int64_t i = 0; i < n; ++i) {
    g[i] = std::sin(0.37f * static_cast<float>(i));
    p0[i] = std::cos(0.11f * static_cast<float>(i));
  }
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdagrad, OptimizerKind::kLion}) {
    OptimizerParams p;
    p.kind = kind;
    p.momentum = 0.9;
    p.weight_decay = 0.1;
    p.initial_accumulator_value = 0.2;
    std::vector<float> a = p0, b = p0, am(n), bm(n), av(n), bv(n);
    for (int64_t s = 1; s <= 3; ++s) {
      p.step = s;
      optimizer_update(a.data(), am.data(), av.data(), g.data(), nullptr, n, p, DType::kF32);
      for (int64_t i0 = 0; i0 < n; i0 += 1237) {
        const int64_t len = std::min<int64_t>(1237, n - i0);
        optimizer_update(b.data() + i0, bm.data() + i0, bv.data() + i0, g.data() + i0, nullptr, len,
                         p, DType::kF32);
      }
    }
    EXPECT_EQ(a, b) << static_cast<int>(kind);
    EXPECT_EQ(am, bm) << static_cast<int>(kind);
    EXPECT_EQ(av, bv) << static_cast<int>(kind);
  }
}

TEST(Optimizers, StepZeroIsRefused) {
  OptimizerParams p;
  p.kind = OptimizerKind::kSgd;
  p.step = 0;
  EXPECT_ANY_THROW(optim_constants(p));
}

}  // namespace
}  // namespace zerod::cpu
