// GPT-2 with a moe section against torch: tests/unit/model/gpt2_moe_reference.py (Debian's
// /usr/bin/python3 with python3-torch) computes the same model in float64 autograd from zerod's
// weights (DeepSpeed-MoE's gating as tests/unit/kernels/moe_reference.py writes it). The
// cross-entropy, the blocks' summed aux and z losses within 1e-5 relative, and every parameter's
// gradient of the objective within 1e-4 of the tensor's largest.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "model/model.h"

namespace zerod {
namespace {

using Json = nlohmann::json;

struct Full : ParamSource, GradSink {
  std::vector<std::vector<float>> w, g;
  const void* acquire(int u) override { return w[u].data(); }
  void release(int) override {}
  void* grad_buffer(int u) override { return g[u].data(); }
  void unit_done(int) override {}
};

// Top-2 over 4 experts with capacity 1.0 (tokens are dropped) in DeepSpeed's top2gating order,
// every other block sparse, a shared expert, DeepSpeed's aux and the z-loss in the objective.
ModelSpec spec() {
  ModelSpec s;
  s.n_layer = 3;
  s.n_head = 2;
  s.n_embd = 16;
  s.vocab_size = 50;
  s.seq_len = 8;
  MoeSpec& m = s.moe;
  m.num_experts = 4;
  m.top_k = 2;
  m.renormalize = true;
  m.drop_tokens = true;
  m.capacity_factor = 1.0;
  m.min_capacity = 1;
  m.drop_policy = MoeDropPolicy::kChoiceRank;
  m.aux_loss = MoeAuxLoss::kDeepSpeed;
  m.aux_loss_coef = 0.1;
  m.z_loss_coef = 0.01;
  m.layer_frequency = 2;  // blocks 0 and 2
  m.shared_experts = 1;
  return s;
}

TEST(Gpt2MoeTorch, LossAuxZAndGradientsMatchTorch) {
  const ModelSpec s = spec();
  const int B = 2, T = 8;
  auto be = make_cpu_backend(DType::kF32);
  auto model = make_model(s, *be, B, T, false, nullptr);
  const ParamLayout& layout = model->layout();
  Full st;
  Json in = {{"B", B}, {"T", T}};
  in["spec"] = {{"n_layer", s.n_layer},
                {"n_head", s.n_head},
                {"n_embd", s.n_embd},
                {"layer_frequency", s.moe.layer_frequency},
                {"moe",
                 {{"num_experts", s.moe.num_experts},
                  {"top_k", s.moe.top_k},
                  {"renormalize", s.moe.renormalize},
                  {"drop_tokens", s.moe.drop_tokens},
                  {"capacity_factor", s.moe.capacity_factor},
                  {"min_capacity", s.moe.min_capacity},
                  {"drop_policy", "choice_rank"},
                  {"aux_loss", "deepspeed"},
                  {"aux_coef", s.moe.aux_loss_coef},
                  {"z_coef", s.moe.z_loss_coef},
                  {"shared_experts", s.moe.shared_experts}}}};
  for (int u = 0; u < layout.num_units(); ++u) {
    const int64_t n = layout.unit(u).numel;
    st.w.emplace_back(n);
    st.g.emplace_back(n, 0.0f);
    layout.init_range(u, st.w.back().data(), 0, n, 9);
    std::vector<float> noise(static_cast<size_t>(n));
    fill_normal(noise.data(), n, 0, 0.2f, 3, static_cast<uint64_t>(u));  // routers that prefer
    for (int64_t i = 0; i < n; ++i) st.w[u][i] += noise[i];
    for (const TensorInfo& t : layout.unit(u).tensors) {
      const int64_t real = t.real_rows >= 0 ? t.real_rows * t.shape.back() : t.numel;
      std::vector<int64_t> shape = t.shape;
      if (t.real_rows >= 0) shape[0] = t.real_rows;
      in["tensors"][t.name] = {{"shape", shape},
                               {"data", std::vector<float>(st.w[u].begin() + t.offset,
                                                           st.w[u].begin() + t.offset + real)}};
    }
  }
  std::vector<int32_t> inputs, targets;
  Rng rng(17);
  for (int i = 0; i < B * T; ++i) {
    inputs.push_back(static_cast<int32_t>(rng.uniform(s.vocab_size)));
    targets.push_back(i == 5 ? -1 : static_cast<int32_t>(rng.uniform(s.vocab_size)));
  }
  in["inputs"] = inputs;
  in["targets"] = targets;
  const float loss = model->forward_backward(inputs.data(), targets.data(), st, st, 1.0f);
  const MoeStepStats stats = model->moe_stats();

  namespace fs = std::filesystem;
  const std::string tag = std::to_string(::getpid());
  const fs::path in_path = fs::temp_directory_path() / ("zerod_gpt2_moe_in_" + tag + ".json");
  const fs::path out_path = fs::temp_directory_path() / ("zerod_gpt2_moe_out_" + tag + ".json");
  std::ofstream(in_path) << in.dump();
  const std::string cmd = "/usr/bin/python3 " ZEROD_SOURCE_DIR
                          "/tests/unit/model/gpt2_moe_reference.py " +
                          in_path.string() + " " + out_path.string();
  const int rc = std::system(cmd.c_str());
  fs::remove(in_path);
  ASSERT_EQ(rc, 0) << "tests/unit/model/gpt2_moe_reference.py failed: it needs /usr/bin/python3 "
                      "with torch (python3-torch, tools/deps.sh)";
  Json ref;
  {
    std::ifstream f(out_path);
    ref = Json::parse(f);
  }
  fs::remove(out_path);

  auto rel = [](double got, double want) { return std::fabs(got - want) / std::fabs(want); };
  EXPECT_LT(rel(loss, ref["loss"].get<double>()), 1e-5) << loss << " vs " << ref["loss"];
  EXPECT_LT(rel(stats.aux_loss, ref["aux"].get<double>()), 1e-5)
      << stats.aux_loss << " vs " << ref["aux"];
  EXPECT_LT(rel(stats.z_loss, ref["z"].get<double>()), 1e-5) << stats.z_loss << " vs " << ref["z"];
  int64_t dropped = 0;
  for (int64_t d : stats.dropped) dropped += d;
  EXPECT_GT(dropped, 0) << "capacity 1.0 at top-2 should drop assignments";
  double worst = 0;
  for (int u = 0; u < layout.num_units(); ++u) {
    for (const TensorInfo& t : layout.unit(u).tensors) {
      const std::vector<double> want = ref["grads"][t.name].get<std::vector<double>>();
      double scale = 0, err = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        scale = std::max(scale, std::fabs(want[i]));
        err = std::max(err, std::fabs(st.g[u][t.offset + static_cast<int64_t>(i)] - want[i]));
      }
      if (scale == 0) {
        EXPECT_EQ(err, 0) << t.name;
        continue;
      }
      worst = std::max(worst, err / scale);
      EXPECT_LT(err / scale, 1e-4) << t.name;
    }
  }
  std::printf(
      "GPT-2 moe vs torch float64: loss %.7g (torch %.7g), aux %.7g, z %.7g, dropped %lld, "
      "worst gradient %.2e\n",
      loss, ref["loss"].get<double>(), stats.aux_loss, stats.z_loss,
      static_cast<long long>(dropped), worst);
}

}  // namespace
}  // namespace zerod
