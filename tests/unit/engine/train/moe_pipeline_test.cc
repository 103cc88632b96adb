// Mixture-of-experts models through pipeline stages (threads of this process, Gloo over
// 127.0.0.1): each stage runs its own MoE blocks (router, experts, per-block DeepSpeed aux and
// z losses with their gradients applied inside the block), so a 4-layer GPT-2 with a moe section
// (4 experts, top-2, dropless and with capacity 1.0) and a 4-layer Mixtral (output_router_logits
// false, Hugging Face's default) train at P = 2 and 4, with 1F1B, zero-bubble and interleaved
// schedules, with activation checkpointing, the losses and gradient norms of one rank, and with
// P = 2 x DP = 2 at ZeRO-1 and ZeRO-3 those of DP = 2 alone (1e-5 relative over 20 steps), and
// P = 2 x DP = 4 with expert parallelism within the stages those of DP = 4 alone; Mixtral with
// its all-layer load-balancing loss in the objective (output_router_logits, whose statistics
// cross the stages with the boundary tensors) too.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <mutex>
#include <string>

#include "engine/config/config_error.h"
#include "train_test_util.h"

namespace zerod {
namespace {

using testing::TempCorpus;
using testing::TinyModel;

TinyModel moe_gpt2(const std::string& moe) {
  return testing::tiny_moe_gpt2(moe, 4);
}
TinyModel mixtral(bool router_logits) {
  return {"Mixtral", R"({"type": "mixtral", "hidden_size": 32, "intermediate_size": 48,
                         "num_hidden_layers": 4, "num_attention_heads": 4,
                         "num_key_value_heads": 2, "vocab_size": 123, "seq_len": 16,
                         "num_local_experts": 4, "num_experts_per_tok": 2,
                         "router_aux_loss_coef": 0.5, "output_router_logits": )" +
                         std::string(router_logits ? "true" : "false") + "}"};
}
constexpr const char* kDropless = R"({"num_experts": 4, "top_k": 2, "drop_tokens": false,
                                      "aux_loss_coef": 0.01, "router_z_loss_coef": 0.01})";
constexpr const char* kCapacity =
    R"({"num_experts": 4, "top_k": 2, "capacity_factor": 1.0, "min_capacity": 1})";

struct Layout {  // the mesh and schedule of a run
  int pipeline = 1, data = 1, stage = 0, virtual_stages = 1, expert = 1, tensor = 1;
  int accum = 4;  // micro-batches per step and data-parallel rank (8 sequences a step)
  std::string schedule = "1f1b";
  bool checkpointing = false;
};
struct Outcome {
  std::vector<double> losses, norms;
};

class MoePipeline : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { corpus_ = new TempCorpus("zerod_moe_pp"); }
  static void TearDownTestSuite() {
    delete corpus_;
    corpus_ = nullptr;
  }

  static JobConfig job(const TinyModel& model, const Layout& r, int steps) {
    TinyModel m = model;
    if (r.checkpointing) {
      m.json.pop_back();
      m.json += R"(, "activation_checkpointing": true})";
    }
    const std::string par = R"(, "parallelism": {"pipeline": )" + std::to_string(r.pipeline) +
                            R"(, "expert": )" + std::to_string(r.expert) + R"(, "tensor": )" +
                            std::to_string(r.tensor) + R"(, "virtual_stages": )" +
                            std::to_string(r.virtual_stages) + R"(, "pipeline_schedule": ")" +
                            r.schedule + R"("})";
    return testing::tiny_job(*corpus_, r.pipeline * r.data * r.tensor, r.stage, r.accum, steps, par,
                             "", 8, "", m);
  }

  static Outcome train(const TinyModel& model, const Layout& r) {
    const JobConfig cfg = job(model, r, 20);
    Outcome out;
    std::mutex mu;
    testing::run_world(r.pipeline * r.data * r.tensor, [&](const RankContext& ctx) {
      Trainer t(cfg, ctx, testing::quiet_trainer());
      const TrainResult res = t.run();
      std::lock_guard<std::mutex> lock(mu);
      if (ctx.rank != 0) return;
      for (const auto& s : res.steps) {
        out.losses.push_back(s.loss);
        out.norms.push_back(s.grad_norm);
      }
    });
    return out;
  }

  static void expect_single(const TinyModel& model, const Layout& r, const std::string& what) {
    // The reference: the same data-parallel ranks and ZeRO stage without stages (the router's
    // aux loss is a function of each micro-batch's tokens, so the micro-batch must match).
    static std::map<std::string, Outcome> singles;
    Outcome& one = singles[model.json + std::to_string(r.data) + std::to_string(r.stage) +
                           std::to_string(r.accum)];
    if (one.losses.empty()) {
      one = train(model, {.data = r.data, .stage = r.stage, .accum = r.accum});
      ASSERT_EQ(one.losses.size(), 20u);
      EXPECT_LT(one.losses.back(), one.losses.front());
    }
    const Outcome o = train(model, r);
    ASSERT_EQ(o.losses.size(), one.losses.size()) << what;
    double worst = 0;
    for (size_t i = 0; i < o.losses.size(); ++i) {
      EXPECT_NEAR(o.losses[i], one.losses[i], 1e-5 * one.losses[i]) << what << ", step " << i + 1;
      EXPECT_NEAR(o.norms[i], one.norms[i], 1e-5 * one.norms[i]) << what << ", norm " << i + 1;
      worst = std::max(worst, std::abs(o.losses[i] / one.losses[i] - 1));
    }
    std::printf("%s %s: worst relative loss difference %.3g\n", model.name, what.c_str(), worst);
  }
  // expect_single at P = 2 (1F1B), P = 4 (zero-bubble), P = 2 x V = 2 (interleaved) and P = 2
  // GPipe with activation checkpointing.
  static void expect_single_every_schedule(const TinyModel& m, const std::string& prefix) {
    expect_single(m, {.pipeline = 2}, prefix + "P=2 1f1b");
    expect_single(m, {.pipeline = 4, .schedule = "zero_bubble"}, prefix + "P=4 zero_bubble");
    expect_single(m, {.pipeline = 2, .virtual_stages = 2, .schedule = "interleaved_1f1b"},
                  prefix + "P=2 V=2 interleaved_1f1b");
    expect_single(m, {.pipeline = 2, .schedule = "gpipe", .checkpointing = true},
                  prefix + "P=2 gpipe checkpointing");
  }

  static TempCorpus* corpus_;
};
TempCorpus* MoePipeline::corpus_ = nullptr;

TEST_F(MoePipeline, StagesRunTheirExpertsAtTheLossesOfOneRank) {
  for (const TinyModel& m : {moe_gpt2(kDropless), moe_gpt2(kCapacity), mixtral(false)})
    expect_single_every_schedule(m, "");
  for (int stage : {1, 3})
    expect_single(moe_gpt2(kDropless), {.pipeline = 2, .data = 2, .stage = stage},
                  "P=2 x DP=2 ZeRO-" + std::to_string(stage));
}

// Expert parallelism within stages: each stage's data-parallel ranks split its experts (groups
// of E consecutive ones), so P = 2 x DP = 4 with E = 2 and E = 4 trains the losses of DP = 4
// alone (E = 1), dropless and with capacity, 1F1B and zero-bubble.
TEST_F(MoePipeline, ExpertParallelGroupsWithinStages) {
  for (const TinyModel& m : {moe_gpt2(kDropless), moe_gpt2(kCapacity)}) {
    for (int E : {2, 4}) {
      expect_single(m, {.pipeline = 2, .data = 4, .stage = 1, .expert = E, .accum = 2},
                    "P=2 x DP=4 E=" + std::to_string(E) + " 1f1b");
    }
    expect_single(
        m,
        {.pipeline = 2, .data = 4, .stage = 1, .expert = 2, .accum = 2, .schedule = "zero_bubble"},
        "P=2 x DP=4 E=2 zero_bubble");
  }
}

TEST_F(MoePipeline, WhatStagesDoNotRunYetIsRefusedNamingTheKeys) {
  auto problems = [&](const TinyModel& m, int world, const std::string& par) {
    return testing::config_problems(
        [&] { testing::tiny_job(*corpus_, world, 0, 4, 1, par, "", 8, "", m); });
  };
  EXPECT_EQ(problems(mixtral(true), 2, R"(, "parallelism": {"pipeline": 2})"), "");
  EXPECT_EQ(problems(mixtral(false), 2, R"(, "parallelism": {"pipeline": 2})"), "");
  const std::string cp =
      problems(moe_gpt2(kCapacity), 4, R"(, "parallelism": {"pipeline": 2, "context": 2})");
  EXPECT_NE(cp.find("model.moe.drop_tokens: true with parallelism.context 2"), std::string::npos)
      << cp;
  EXPECT_EQ(problems(moe_gpt2(kDropless), 4, R"(, "parallelism": {"pipeline": 2, "context": 2})"),
            "");
}

// Mixtral's load-balancing loss over every layer's router logits (Hugging Face's, in the
// objective with output_router_logits): each layer's backward needs the assignment counts of
// every layer of the micro-batch, which pass forward from stage to stage with the activations
// and back with the gradients. It changes training (coefficient 0.5: the losses differ from
// those without it), and the stages train one rank's losses with every schedule.
TEST_F(MoePipeline, MixtralsAllLayerAuxLossCrossesTheStages) {
  const Outcome with = train(mixtral(true), {}), without = train(mixtral(false), {});
  ASSERT_EQ(with.losses.size(), 20u);
  double apart = 0;
  for (size_t i = 0; i < with.losses.size(); ++i)
    apart = std::max(apart, std::abs(with.losses[i] / without.losses[i] - 1));
  EXPECT_GT(apart, 1e-3) << "the aux loss does not change training: the test would prove nothing";
  const TinyModel m = mixtral(true);
  expect_single_every_schedule(m, "aux ");
  expect_single(m, {.pipeline = 2, .data = 2, .stage = 1}, "aux P=2 x DP=2 ZeRO-1");
}

// Stages whose MoE blocks are split over a tensor group (docs/moe.md): P = 2 x T = 2 trains one
// rank's losses.
TEST_F(MoePipeline, StagesTimesTensorTwoTrainTheLossesOfOneRank) {
  expect_single(moe_gpt2(kDropless), {.pipeline = 2, .tensor = 2}, "P=2 x T=2 1f1b");
  expect_single(mixtral(false), {.pipeline = 2, .tensor = 2, .schedule = "zero_bubble"},
                "P=2 x T=2 zero_bubble");
}

}  // namespace
}  // namespace zerod
