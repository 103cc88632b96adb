// Mixture of experts with context parallelism through the whole trainer (threads of this process,
// Gloo over 127.0.0.1): each context rank routes its seq/C positions of every sequence, and every
// MoE layer sums its router statistics (assignment counts, probability sums, z-loss sum, rows)
// over the context group, so the aux and z losses and their gradients are the whole
// micro-batch's. C = 2 (Ulysses and ring) trains the losses and gradient norms of one rank
// within 1e-5 relative over 20 steps: GPT-2 with a dropless moe section (DeepSpeed's per-layer
// aux loss, a z-loss and a shared expert) and Mixtral (Hugging Face's all-layer aux loss); so do
// C = 2 x DP = 2 (those of DP = 2), C = 2 x T = 2, C = 2 x DP = 2 x E = 2 and P = 2 x C = 2.
// Capacity (token dropping) with context parallelism is refused while the job is checked.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "engine/config/config_error.h"
#include "train_test_util.h"

namespace zerod {
namespace {

using testing::TinyModel;
using Outcome = testing::RunOutcome;

TinyModel mixtral(bool aux) {
  return {"Mixtral", R"({"type": "mixtral", "hidden_size": 32, "intermediate_size": 48,
                         "num_hidden_layers": 2, "num_attention_heads": 4,
                         "num_key_value_heads": 2, "vocab_size": 123, "num_local_experts": 4,
                         "num_experts_per_tok": 2, "router_aux_loss_coef": 0.5,
                         "output_router_logits": )" +
                         std::string(aux ? "true" : "false") + R"(, "seq_len": 16})"};
}
TinyModel gpt2(double coef) {
  const std::string c = std::to_string(coef);
  return testing::tiny_moe_gpt2(R"({"num_experts": 4, "top_k": 2, "drop_tokens": false,
      "aux_loss_coef": )" + c + R"(, "router_z_loss_coef": )" +
                                    c + R"(, "shared_experts": 1})",
                                2);
}

class MoeContextParallel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { corpus_ = new testing::TempCorpus("zerod_moe_cp"); }
  static void TearDownTestSuite() {
    delete corpus_;
    corpus_ = nullptr;
  }
  static Outcome train(const TinyModel& model, int world, int context, int tensor = 1,
                       const std::string& impl = "ulysses") {
    std::string par;
    if (context > 1 || tensor > 1) {
      par = R"(, "parallelism": {"context": )" + std::to_string(context) + R"(, "tensor": )" +
            std::to_string(tensor) + R"(, "context_impl": ")" + impl + R"("})";
    }
    const JobConfig cfg = testing::tiny_job(*corpus_, world, 1, 1, 20, par, "", 8, "", model);
    return testing::train_outcome(cfg, world);
  }
  static testing::TempCorpus* corpus_;
};
testing::TempCorpus* MoeContextParallel::corpus_ = nullptr;

// The router losses move training (their coefficients change the losses by more than 1e-3, so
// the comparisons below would see per-rank statistics), and C = 2 trains one rank's losses.
TEST_F(MoeContextParallel, ContextTwoTrainsTheLossesOfOneRank) {
  const struct {
    TinyModel with, without;
  } models[] = {{gpt2(0.1), gpt2(0.0)}, {mixtral(true), mixtral(false)}};
  for (const auto& m : models) {
    const Outcome one = train(m.with, 1, 1);
    const Outcome plain = train(m.without, 1, 1);
    ASSERT_EQ(one.losses.size(), 20u);
    EXPECT_LT(one.losses.back(), one.losses.front());
    double apart = 0;
    for (size_t i = 0; i < one.losses.size(); ++i)
      apart = std::max(apart, std::abs(one.losses[i] / plain.losses[i] - 1));
    EXPECT_GT(apart, 1e-3) << m.with.name << ": the router losses do not change training";
    for (const char* impl : {"ulysses", "ring"}) {
      const Outcome cp = train(m.with, 2, 2, 1, impl);
      testing::expect_outcome_close(cp, one, 1e-5, std::string(m.with.name) + " C=2 " + impl);
    }
  }
}

TEST_F(MoeContextParallel, WithDataAndTensorParallelism) {
  for (const TinyModel& m : {gpt2(0.1), mixtral(true)}) {
    const Outcome dp = train(m, 2, 1);
    testing::expect_outcome_close(train(m, 4, 2), dp, 1e-5, std::string(m.name) + " C=2 x DP=2");
    const Outcome one = train(m, 1, 1);
    testing::expect_outcome_close(train(m, 4, 2, 2, "ring"), one, 1e-5,
                                  std::string(m.name) + " C=2 x T=2 ring");
  }
}

// Expert groups over the data x context ranks (each storing its experts), and pipeline stages
// (Mixtral's all-layer statistics, already summed over the context group, crossing the stages):
// C = 2 x DP = 2 x E = 2 trains the losses of DP = 2, P = 2 x C = 2 those of one rank (2
// micro-batches a step).
TEST_F(MoeContextParallel, WithExpertGroupsAndPipelineStages) {
  const TinyModel m = gpt2(0.1);
  const JobConfig ep = testing::tiny_job(
      *corpus_, 4, 1, 1, 20, R"(, "parallelism": {"context": 2, "expert": 2})", "", 8, "", m);
  testing::expect_outcome_close(testing::train_outcome(ep, 4), train(m, 2, 1), 1e-5,
                                "Gpt2 C=2 x DP=2 x E=2");
  const JobConfig one = testing::tiny_job(*corpus_, 1, 1, 2, 20, "", "", 8, "", mixtral(true));
  const JobConfig pp =
      testing::tiny_job(*corpus_, 4, 1, 2, 20, R"(, "parallelism": {"context": 2, "pipeline": 2})",
                        "", 8, "", mixtral(true));
  testing::expect_outcome_close(testing::train_outcome(pp, 4), testing::train_outcome(one, 1), 1e-5,
                                "Mixtral P=2 x C=2");
}

TEST_F(MoeContextParallel, WhatItDoesNotRunWithIsRefusedNamingTheKeys) {
  auto problems = [&](int world, const std::string& extra, const TinyModel& model) {
    return testing::config_problems(
        [&] { testing::tiny_job(*corpus_, world, 1, 2, 1, extra, "", 8, "", model); });
  };
  const TinyModel capacity = testing::tiny_moe_gpt2(R"({"num_experts": 4, "top_k": 2})", 2);
  const std::string drop = problems(2, R"(, "parallelism": {"context": 2})", capacity);
  EXPECT_NE(drop.find("model.moe.drop_tokens: true with parallelism.context 2"), std::string::npos)
      << drop;
  EXPECT_EQ(problems(2, R"(, "parallelism": {"context": 2})", gpt2(0.1)), "");
  EXPECT_EQ(problems(2, R"(, "parallelism": {"context": 2})", mixtral(true)), "");
}

}  // namespace
}  // namespace zerod
