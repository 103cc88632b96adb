// Mixture-of-experts blocks inside whole models (model/moe_block.h): Mixtral, GPT-2 with a moe
// section (top-1 with capacity and dropping, every other block, a shared expert) and Llama with
// one (top-3, dropping by probability, a shared expert). The gradient of the objective (the
// cross-entropy plus the coefficients times the aux and z losses) against finite differences of
// it, activation checkpointing bit for bit, the activations the model allocates against
// model_activation_bytes, and the layout's expert tensors and parameter counts.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "core/rng.h"
#include "model/model.h"
#include "model/shard.h"

namespace zerod {
namespace {

ModelSpec mixtral() {
  ModelSpec s;
  s.arch = ModelArch::kMixtral;
  s.n_layer = 2;
  s.n_head = 4;
  s.n_kv_head = 2;
  s.n_embd = 24;  // head size 6
  s.intermediate_size = 14;
  s.vocab_size = 37;
  s.seq_len = 11;
  s.rms_norm_eps = 1e-5;
  s.tie_word_embeddings = false;
  s.moe.num_experts = 4;
  s.moe.top_k = 2;
  s.moe.aux_loss = MoeAuxLoss::kHuggingFace;
  s.moe.aux_loss_coef = 0.3;
  s.moe.z_loss_coef = 0.05;
  return s;
}

ModelSpec gpt2_moe() {
  ModelSpec s;
  s.n_layer = 2;
  s.n_head = 3;
  s.n_embd = 18;
  s.vocab_size = 37;
  s.seq_len = 11;
  s.moe.num_experts = 3;
  s.moe.top_k = 1;
  s.moe.renormalize = false;
  s.moe.drop_tokens = true;
  s.moe.capacity_factor = 1.0;
  s.moe.eval_capacity_factor = 1.0;
  s.moe.min_capacity = 1;
  s.moe.drop_policy = MoeDropPolicy::kChoiceRank;
  s.moe.aux_loss = MoeAuxLoss::kDeepSpeed;
  s.moe.aux_loss_coef = 0.2;
  s.moe.z_loss_coef = 0.05;
  s.moe.layer_frequency = 2;  // block 0 sparse, block 1 dense
  s.moe.shared_experts = 1;
  return s;
}

ModelSpec llama_moe() {
  ModelSpec s = mixtral();
  s.arch = ModelArch::kLlama;
  s.n_layer = 3;
  s.tie_word_embeddings = true;
  s.moe.num_experts = 5;
  s.moe.top_k = 3;
  s.moe.drop_tokens = true;
  s.moe.capacity_factor = 1.5;
  s.moe.eval_capacity_factor = 1.5;
  s.moe.min_capacity = 0;
  s.moe.drop_policy = MoeDropPolicy::kProbs;
  s.moe.aux_loss = MoeAuxLoss::kDeepSpeed;
  s.moe.shared_experts = 1;
  return s;
}

struct Case {
  const char* name;
  ModelSpec spec;
};
std::string case_name(const testing::TestParamInfo<Case>& info) {
  return info.param.name;
}

class States : public ParamSource, public GradSink {
 public:
  States(const ParamLayout& layout, uint64_t seed) {
    for (int u = 0; u < layout.num_units(); ++u) {
      const int64_t n = layout.unit(u).numel;
      weights.emplace_back(n);
      layout.init_range(u, weights.back().data(), 0, n, seed);
      // Larger weights than the init: routers with preferences, a less flat loss.
      std::vector<float> noise(static_cast<size_t>(n));
      fill_normal(noise.data(), n, 0, 0.15f, 11, static_cast<uint64_t>(u));
      for (int64_t i = 0; i < n; ++i) weights.back()[i] += noise[i];
      grads.emplace_back(n, 0.0f);
    }
  }
  const void* acquire(int u) override { return weights[u].data(); }
  void release(int) override {}
  void* grad_buffer(int u) override { return grads[u].data(); }
  void unit_done(int) override {}
  void zero_grad() {
    for (auto& g : grads) std::fill(g.begin(), g.end(), 0.0f);
  }
  std::vector<std::vector<float>> weights, grads;
};

struct Batch {
  std::vector<int32_t> inputs, targets;
};
Batch random_batch(int B, int T, int V, uint64_t seed) {
  Batch b;
  Rng rng(seed);
  for (int i = 0; i < B * T; ++i) {
    b.inputs.push_back(static_cast<int32_t>(rng.uniform(V)));
    b.targets.push_back(static_cast<int32_t>(rng.uniform(V)));
  }
  b.targets[3] = -1;
  return b;
}

class MoeModelTest : public testing::TestWithParam<Case> {};

INSTANTIATE_TEST_SUITE_P(Moe, MoeModelTest,
                         testing::Values(Case{"mixtral", mixtral()}, Case{"gpt2_moe", gpt2_moe()},
                                         Case{"llama_moe", llama_moe()}),
                         case_name);

// The objective forward_backward differentiates: the returned cross-entropy plus the router
// losses with their coefficients (moe_stats().objective).
double objective(Model& m, States& st, const Batch& b) {
  st.zero_grad();
  const float ce = m.forward_backward(b.inputs.data(), b.targets.data(), st, st, 1.0f);
  return double{ce} + m.moe_stats().objective;
}

TEST_P(MoeModelTest, GradientsMatchFiniteDifferencesOfTheObjective) {
  const ModelSpec s = GetParam().spec;
  const int B = 2, T = 9;
  auto be = make_cpu_backend(DType::kF32);
  auto model = make_model(s, *be, B, T, false, nullptr);
  States st(model->layout(), 5);
  const Batch b = random_batch(B, T, s.vocab_size, 3);
  objective(*model, st, b);
  const MoeStepStats stats = model->moe_stats();
  EXPECT_GT(stats.aux_loss, 0.5);  // about 1 when balanced
  EXPECT_GT(stats.z_loss, 0.0);
  EXPECT_EQ(static_cast<int>(stats.layers.size()), s.moe.moe_layers(s.n_layer));
  const std::vector<std::vector<float>> grads = st.grads;
  // Per unit: the directional derivative along a random direction against a central
  // difference. The routing is piecewise constant: eps small enough that no top-k choice or
  // capacity decision flips (checked: the same kept counts on both sides).
  for (int u = 0; u < model->layout().num_units(); ++u) {
    const UnitLayout& unit = model->layout().unit(u);
    std::vector<float> d(static_cast<size_t>(unit.numel), 0.0f);
    for (const TensorInfo& t : unit.tensors) {
      const int64_t real = t.real_rows >= 0 ? t.real_rows * t.shape.back() : t.numel;
      fill_normal(d.data() + t.offset, real, 0, 1, 21, t.stream);
    }
    double norm = 0;
    for (float x : d) norm += double{x} * x;
    norm = std::sqrt(norm);
    double analytic = 0;
    for (int64_t i = 0; i < unit.numel; ++i) analytic += double{grads[u][i]} * d[i] / norm;
    std::vector<float>& w = st.weights[u];
    const std::vector<float> saved = w;
    const double eps = 2e-3;
    std::vector<std::vector<int64_t>> kept[2];
    auto at = [&](int side) {
      const double sign = side == 0 ? 1.0 : -1.0;
      for (int64_t i = 0; i < unit.numel; ++i)
        w[i] = static_cast<float>(saved[i] + sign * eps * d[i] / norm);
      const double f = objective(*model, st, b);
      kept[side] = model->moe_stats().kept;
      return f;
    };
    const double numeric = (at(0) - at(1)) / (2 * eps);
    w = saved;
    ASSERT_EQ(kept[0], kept[1]) << unit.name << ": the routing changed; pick another eps";
    EXPECT_NEAR(analytic, numeric, 2e-3 + 2e-2 * std::abs(numeric)) << unit.name;
    EXPECT_GT(std::abs(analytic), 3e-4) << unit.name << ": a vanishing gradient proves nothing";
  }
}

// The router losses reach the gradient: with their coefficients at 0 the router's gradient
// changes, and the aux and z losses' values do not.
TEST_P(MoeModelTest, RouterLossCoefficientsChangeOnlyTheGradient) {
  ModelSpec s = GetParam().spec;
  const int B = 2, T = 8;
  const Batch b = random_batch(B, T, s.vocab_size, 4);
  auto run = [&](const ModelSpec& spec, MoeStepStats* stats) {
    auto be = make_cpu_backend(DType::kF32);
    auto model = make_model(spec, *be, B, T, false, nullptr);
    States st(model->layout(), 5);
    model->forward_backward(b.inputs.data(), b.targets.data(), st, st, 1.0f);
    *stats = model->moe_stats();
    return st.grads[1];  // block 0: a MoE block in every case
  };
  MoeStepStats with, without;
  const std::vector<float> g1 = run(s, &with);
  s.moe.aux_loss_coef = s.moe.z_loss_coef = 0;
  const std::vector<float> g0 = run(s, &without);
  EXPECT_EQ(with.aux_loss, without.aux_loss);
  EXPECT_EQ(with.z_loss, without.z_loss);
  EXPECT_EQ(without.objective, 0.0);
  EXPECT_NE(g1, g0);
}

TEST_P(MoeModelTest, ActivationCheckpointingGivesBitIdenticalGradients) {
  const ModelSpec s = GetParam().spec;
  const Batch b = random_batch(3, 11, s.vocab_size, 5);
  std::vector<std::vector<float>> grads[2];
  float loss[2];
  MoeStepStats stats[2];
  for (int ckpt = 0; ckpt < 2; ++ckpt) {
    auto be = make_cpu_backend(DType::kF32);
    auto model = make_model(s, *be, 3, 11, ckpt == 1, nullptr);
    States st(model->layout(), 5);
    loss[ckpt] = model->forward_backward(b.inputs.data(), b.targets.data(), st, st, 0.5f);
    stats[ckpt] = model->moe_stats();
    grads[ckpt] = st.grads;
  }
  EXPECT_EQ(loss[0], loss[1]);
  EXPECT_EQ(stats[0].aux_loss, stats[1].aux_loss);
  EXPECT_EQ(stats[0].kept, stats[1].kept);
  EXPECT_EQ(stats[0].dropped, stats[1].dropped);
  for (size_t u = 0; u < grads[0].size(); ++u) EXPECT_EQ(grads[0][u], grads[1][u]) << u;
}

TEST_P(MoeModelTest, ActivationsAreWhatModelActivationBytesSays) {
  const ModelSpec s = GetParam().spec;
  for (bool ckpt : {false, true}) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      auto be = make_cpu_backend(dt);
      MemoryTracker tracker;
      auto model = make_model(s, *be, 2, 10, ckpt, &tracker);
      EXPECT_EQ(tracker.current(MemCategory::kActivations),
                model_activation_bytes(s, 2, 10, ckpt, be->compute_elem_size()))
          << (ckpt ? "checkpointing" : "plain");
    }
  }
}

// The layout holds every expert's tensors under Hugging Face's Mixtral names (DeepSpeed-MoE's
// for GPT-2), and its real parameters are num_parameters().
TEST_P(MoeModelTest, LayoutNamesAndParameterCounts) {
  const ModelSpec s = GetParam().spec;
  const ParamLayout layout(s);
  int64_t real = 0, experts = 0;
  for (int u = 0; u < layout.num_units(); ++u)
    for (const TensorInfo& t : layout.unit(u).tensors) {
      const int64_t n = t.real_rows >= 0 ? t.real_rows * t.shape.back() : t.numel;
      real += n;
      if (t.name.find(".experts.") != std::string::npos &&
          t.name.find("shared") == std::string::npos)
        experts += n;
    }
  EXPECT_EQ(real, s.num_parameters());
  EXPECT_EQ(experts, moe_expert_parameters(s));
  // Block 0 is a MoE block: its unit (1) holds the router, the next unit (2) its routed experts,
  // and nothing else.
  const UnitLayout& block0 = layout.unit(1);
  const UnitLayout& experts0 = layout.unit(2);
  ASSERT_EQ(layout.block_unit(0), 1);
  ASSERT_EQ(layout.experts_unit(0), 2);
  EXPECT_FALSE(block0.experts);
  EXPECT_TRUE(experts0.experts);
  for (const TensorInfo& t : experts0.tensors)
    EXPECT_TRUE(t.name.find(".experts.") != std::string::npos &&
                t.name.find("shared") == std::string::npos)
        << t.name;
  for (const TensorInfo& t : block0.tensors)
    EXPECT_TRUE(t.name.find(".experts.") == std::string::npos) << t.name;
  if (s.llama_family()) {
    EXPECT_EQ(block0.tensor("model.layers.0.block_sparse_moe.gate.weight").shape,
              (std::vector<int64_t>{s.moe.num_experts, s.n_embd}));
    const int last = s.moe.num_experts - 1;
    const std::string e = "model.layers.0.block_sparse_moe.experts." + std::to_string(last);
    EXPECT_EQ(experts0.tensor(e + ".w1.weight").shape,
              (std::vector<int64_t>{s.intermediate_size, s.n_embd}));
    EXPECT_EQ(experts0.tensor(e + ".w2.weight").shape,
              (std::vector<int64_t>{s.n_embd, s.intermediate_size}));
    // w1 and w3 of an expert lie back to back (one grouped matmul computes gate | up).
    EXPECT_EQ(experts0.tensor(e + ".w3.weight").offset,
              experts0.tensor(e + ".w1.weight").offset + s.intermediate_size * s.n_embd);
  } else {
    EXPECT_EQ(block0.tensor("h.0.mlp.deepspeed_moe.gate.wg.weight").shape,
              (std::vector<int64_t>{s.moe.num_experts, s.n_embd}));
    EXPECT_NO_THROW(experts0.tensor("h.0.mlp.deepspeed_moe.experts.deepspeed_experts.2.c_fc.bias"));
    // Block 1, when dense, has no experts unit.
    if (!s.moe.is_moe_layer(1)) {
      EXPECT_EQ(layout.experts_unit(1), -1);
      EXPECT_NO_THROW(layout.unit(layout.block_unit(1)).tensor("h.1.mlp.c_fc.weight"));
    }
  }
}

// Expert parallelism's storage (TensorShard::expert_rank of expert_size): rank r's experts unit
// holds experts [r n/E, (r+1) n/E) of each MoE block, expert by expert, and is the range
// [experts_offset, + numel) of the unit of every expert: its initialisation, its part of an
// imported unit (shard_unit), alone and under tensor parallelism; the ranks' parts put back
// (unshard_unit) rebuild the unit of every expert; every other unit is unchanged.
TEST_P(MoeModelTest, ExpertShardsAreRangesOfTheUnitOfEveryExpert) {
  const ModelSpec s = GetParam().spec;
  const int n = s.moe.num_experts;
  const ParamLayout global(s);
  auto init = [](const ParamLayout& l, int u) {
    std::vector<float> v(static_cast<size_t>(l.unit(u).numel));
    l.init_range(u, v.data(), 0, l.unit(u).numel, 17);
    return v;
  };
  auto ramp = [](const ParamLayout& l, int u) {
    std::vector<float> v(static_cast<size_t>(l.unit(u).numel));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 997) + 1.0f;
    return v;
  };
  int checked = 0;
  for (int T : {1, 2}) {
    if (!tensor_parallel_problem(s, T).empty()) continue;
    for (int E = 2; E <= n; ++E) {
      if (n % E != 0) continue;
      for (int t = 0; t < T; ++t) {
        const ParamLayout all(s, 16, TensorShard{t, T});
        std::vector<std::vector<float>> rebuilt(static_cast<size_t>(all.num_units()));
        for (int r = 0; r < E; ++r) {
          const ParamLayout local(s, 16, TensorShard{t, T, false, r, E});
          const std::string at =
              "T=" + std::to_string(T) + " E=" + std::to_string(E) + " rank " + std::to_string(r);
          ASSERT_EQ(local.num_units(), all.num_units()) << at;
          EXPECT_EQ(local.local_experts(), n / E);
          EXPECT_EQ(local.first_expert(), r * n / E);
          for (int u = 0; u < local.num_units(); ++u) {
            const UnitLayout& lu = local.unit(u);
            const std::vector<float> mine = init(local, u), every = init(all, u);
            const std::vector<float> whole = ramp(global, u);
            std::vector<float> part(mine.size()), all_part(every.size());
            shard_unit(global, local, u, whole.data(), part.data());
            shard_unit(global, all, u, whole.data(), all_part.data());
            if (!lu.experts) {
              EXPECT_EQ(lu.numel, all.unit(u).numel) << at << " " << lu.name;
              EXPECT_EQ(mine, every) << at << " " << lu.name;
              EXPECT_EQ(part, all_part) << at << " " << lu.name;
              continue;
            }
            ++checked;
            EXPECT_EQ(lu.numel * E, all.unit(u).numel) << at << " " << lu.name;
            EXPECT_EQ(lu.tensors.size() * E, all.unit(u).tensors.size()) << at;
            for (const TensorInfo& x : lu.tensors) {
              // "...experts.<e>." (Mixtral) or "...deepspeed_experts.<e>." (GPT-2)
              const std::string tail = x.name.substr(x.name.find("experts.") + 8);
              const int e = std::stoi(tail.substr(tail.find_first_of("0123456789")));
              EXPECT_TRUE(e >= r * n / E && e < (r + 1) * n / E) << at << " " << x.name;
            }
            const int64_t off = local.experts_offset();
            EXPECT_TRUE(std::equal(mine.begin(), mine.end(), every.begin() + off))
                << at << " " << lu.name << ": the initialisation";
            EXPECT_TRUE(std::equal(part.begin(), part.end(), all_part.begin() + off))
                << at << " " << lu.name << ": the imported part";
            std::vector<float>& back = rebuilt[static_cast<size_t>(u)];
            back.resize(whole.size(), 0.0f);
            unshard_unit(global, local, u, part.data(), back.data());
          }
        }
        // Every expert rank's part of every experts unit put back: this tensor rank's part of
        // the whole unit, as from the layout of every expert.
        for (int u = 0; u < all.num_units(); ++u) {
          if (!all.unit(u).experts) continue;
          const std::vector<float> whole = ramp(global, u);
          std::vector<float> from_all(whole.size(), 0.0f), all_part(all.unit(u).numel);
          shard_unit(global, all, u, whole.data(), all_part.data());
          unshard_unit(global, all, u, all_part.data(), from_all.data());
          EXPECT_EQ(rebuilt[static_cast<size_t>(u)], from_all) << all.unit(u).name;
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

// Mixtral-8x7B's shape: transformers' count of MixtralForCausalLM's parameters (46.7 B), of
// which the experts are 45.1 B.
TEST(MoeSpec, Mixtral8x7bHasTransformersParameterCount) {
  ModelSpec s;
  s.arch = ModelArch::kMixtral;
  s.n_layer = 32;
  s.n_head = 32;
  s.n_kv_head = 8;
  s.n_embd = 4096;
  s.intermediate_size = 14336;
  s.vocab_size = 32000;
  s.seq_len = 4096;
  s.tie_word_embeddings = false;
  s.moe.num_experts = 8;
  s.moe.top_k = 2;
  EXPECT_EQ(s.num_parameters(), 46702792704);
  EXPECT_EQ(moe_expert_parameters(s), int64_t{32} * 8 * 3 * 14336 * 4096);
}

}  // namespace
}  // namespace zerod
