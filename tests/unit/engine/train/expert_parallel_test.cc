// Expert parallelism through the whole trainer (threads of this process, Gloo over 127.0.0.1):
// GPT-2 and Llama with a moe section of 4 experts, top-2, on 4 data-parallel ranks, with the
// experts spread over expert-parallel groups of E = 2 (two groups) and E = 4 (one), each rank
// storing its own experts (ZeRO over their expert-data-parallel group), train the losses and
// gradient norms of E = 1 (every rank holding every expert) at the same global batch: 1e-5
// relative over 20 steps, dropless and with capacity 1.0 (tokens dropped), at ZeRO stages 0-3
// and stage 3 with CPU offload. Bad shapes and optimizers that do not run with it are refused
// while the job is checked, naming the keys.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <mutex>
#include <string>

#include "engine/config/config_error.h"
#include "train_test_util.h"

namespace zerod {
namespace {

using testing::TempCorpus;
using testing::TinyModel;

TinyModel moe_gpt2(const std::string& moe) {
  return testing::tiny_moe_gpt2(moe, 2);
}
TinyModel moe_llama(const std::string& moe) {
  return {"Llama", R"({"type": "llama", "hidden_size": 32, "intermediate_size": 48,
                       "num_hidden_layers": 2, "num_attention_heads": 4,
                       "num_key_value_heads": 2, "vocab_size": 123, "seq_len": 16, "moe": )" +
                       moe + "}"};
}

constexpr const char* kDropless =
    R"({"num_experts": 4, "top_k": 2, "drop_tokens": false, "router_z_loss_coef": 0.01})";
constexpr const char* kCapacity =
    R"({"num_experts": 4, "top_k": 2, "capacity_factor": 1.0, "min_capacity": 1})";

using Outcome = testing::RunOutcome;

Outcome train(const TempCorpus& corpus, const TinyModel& model, int expert, int stage,
              const std::string& zero_extra = "", const std::string& train_extra = "",
              const std::string& resume = "") {
  const std::string par =
      expert > 1 ? R"(, "parallelism": {"expert": )" + std::to_string(expert) + "}" : "";
  const int world = 4;
  const JobConfig cfg =
      testing::tiny_job(corpus, world, stage, 1, 20, par, train_extra, 8, zero_extra, model);
  EXPECT_EQ(cfg.parallelism.expert, expert);
  return testing::train_outcome(cfg, world, resume);
}

void expect_close(const Outcome& a, const Outcome& ref, double rel, const std::string& what) {
  testing::expect_outcome_close(a, ref, rel, what);
}

class ExpertParallel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { corpus_ = new TempCorpus("zerod_ep"); }
  static void TearDownTestSuite() {
    delete corpus_;
    corpus_ = nullptr;
  }
  static void check_optimizer_with_experts(const std::string& optimizer);
  static TempCorpus* corpus_;
};
TempCorpus* ExpertParallel::corpus_ = nullptr;

TEST_F(ExpertParallel, TwoAndFourTrainTheLossesOfOneDropless) {
  for (const TinyModel& m : {moe_gpt2(kDropless), moe_llama(kDropless)}) {
    const Outcome one = train(*corpus_, m, 1, 0);
    ASSERT_EQ(one.losses.size(), 20u);
    EXPECT_LT(one.losses.back(), one.losses.front());
    for (int E : {2, 4}) {
      const Outcome ep = train(*corpus_, m, E, 0);
      expect_close(ep, one, 1e-5, std::string(m.name) + " dropless E=" + std::to_string(E));
      for (double l : ep.rank_last_loss) EXPECT_TRUE(std::isfinite(l));
    }
  }
}

// Muon (zero/muon_exchange.h): the experts' matrices are orthogonalised over their own
// expert-data-parallel group (each rank's experts whole on it), the others over the data-parallel
// group; Lamb (zero/lamb_step.cc): the experts' norms sum over that group. E = 2 trains E = 1's
// losses and norms within 2e-7 over 10 steps (measured at most 3e-8; Lamb's experts' norms left
// unsummed over their group give 5.8e-7 to 3.9e-6), at ZeRO stages 0 and 1 (the owners spread
// over the groups) and for Llama at stage 3 with the optimizer on the host.
TEST_F(ExpertParallel, MuonAndLambTrainTheLossesOfOne) {
  for (const std::string& opt :
       {testing::other_optimizers()[4].second, std::string(testing::kTinyLamb)}) {
    SCOPED_TRACE(opt);
    check_optimizer_with_experts(opt);
  }
}

void ExpertParallel::check_optimizer_with_experts(const std::string& optimizer) {
  auto run = [&](const TinyModel& m, int expert, int stage, const std::string& zero_extra) {
    const std::string par =
        expert > 1 ? R"(, "parallelism": {"expert": )" + std::to_string(expert) + "}" : "";
    return testing::train_outcome(
        testing::tiny_job(*corpus_, 4, stage, 1, 10, par, "", 8, zero_extra, m, optimizer), 4);
  };
  // 6 experts: at E = 2 each rank's 3 experts are split over an expert-data-parallel group of 2,
  // the cut falling inside a tensor (the sums over that group matter; with 4 experts it falls
  // between two experts' tensors).
  constexpr const char* kSix = R"({"num_experts": 6, "top_k": 2, "drop_tokens": false})";
  for (const TinyModel& m : {moe_gpt2(kSix), moe_llama(kSix)}) {
    for (int stage : {0, 1}) {
      const Outcome one = run(m, 1, stage, "");
      ASSERT_EQ(one.losses.size(), 10u);
      EXPECT_LT(one.losses.back(), one.losses.front());
      expect_close(run(m, 2, stage, ""), one, 2e-7,
                   std::string(m.name) + " stage " + std::to_string(stage) + " E=2");
    }
  }
  const std::string host = R"(, "offload_optimizer": {"device": "cpu"})";
  const Outcome one = run(moe_llama(kSix), 1, 3, host);
  expect_close(run(moe_llama(kSix), 2, 3, host), one, 2e-7, "Llama stage 3 offload E=2");
}

TEST_F(ExpertParallel, TwoAndFourTrainTheLossesOfOneWithCapacityAtStageOne) {
  const TinyModel m = moe_gpt2(kCapacity);
  for (int stage : {0, 1}) {
    const Outcome one = train(*corpus_, m, 1, stage);
    for (int E : {2, 4}) {
      const Outcome ep = train(*corpus_, m, E, stage);
      expect_close(ep, one, 1e-5,
                   "capacity stage " + std::to_string(stage) + " E=" + std::to_string(E));
    }
  }
}

// ZeRO stages 2 and 3 (gradients and parameters sharded over the data-parallel group: a rank's
// zero gradients of the experts it does not compute add nothing to another rank's), and stage 3
// with the optimizer states and parameters offloaded to CPU memory: E = 2 and 4 train the losses
// of E = 1 at the same stage.
TEST_F(ExpertParallel, AtZeroStagesTwoAndThreeAndWithCpuOffload) {
  for (const TinyModel& m : {moe_gpt2(kCapacity), moe_llama(kDropless)}) {
    for (int stage : {2, 3}) {
      const Outcome one = train(*corpus_, m, 1, stage);
      for (int E : {2, 4}) {
        const Outcome ep = train(*corpus_, m, E, stage);
        expect_close(
            ep, one, 1e-5,
            std::string(m.name) + " stage " + std::to_string(stage) + " E=" + std::to_string(E));
      }
    }
  }
  const std::string offload = R"(, "offload_optimizer": {"device": "cpu"},
                                  "offload_param": {"device": "cpu"})";
  const TinyModel m = moe_llama(kDropless);
  const Outcome one = train(*corpus_, m, 1, 3, offload);
  const Outcome ep = train(*corpus_, m, 2, 3, offload);
  expect_close(ep, one, 1e-5, "Llama stage 3 + CPU offload E=2");
}

// Each rank stores its n/E experts only: its experts units are 1/E of E = 1's, and at ZeRO
// stage 0 (fp32: weights, gradients and Adam's moments of every stored element, 16 bytes) its
// model states are 16 bytes x the experts it does not store smaller, exactly. At stage 1 the
// weights and gradients (8 bytes an element) shrink, and the moments stay (the experts'
// optimizer shards over DP/E ranks are the size of their 1/DP shard over DP).
TEST_F(ExpertParallel, EachRankStoresItsOwnExpertsOnly) {
  const TinyModel m = moe_gpt2(kDropless);
  for (int stage : {0, 1}) {
    const Outcome one = train(*corpus_, m, 1, stage);
    ASSERT_GT(one.experts_elems, 0);
    for (int E : {2, 4}) {
      const Outcome ep = train(*corpus_, m, E, stage);
      const std::string at = "stage " + std::to_string(stage) + " E=" + std::to_string(E);
      EXPECT_EQ(ep.experts_elems * E, one.experts_elems) << at;
      const int64_t gone = one.experts_elems - ep.experts_elems;
      EXPECT_EQ(one.states.weights - ep.states.weights, 4 * gone) << at;
      EXPECT_EQ(one.states.gradients - ep.states.gradients, 4 * gone) << at;
      if (stage == 0) {
        EXPECT_EQ(one.states.moments - ep.states.moments, 8 * gone) << at;
        EXPECT_EQ(one.states.states() - ep.states.states(), 16 * gone) << at;
      } else {
        EXPECT_NEAR(static_cast<double>(ep.states.moments), static_cast<double>(one.states.moments),
                    0.01 * one.states.moments)
            << at;
      }
      expect_close(ep, one, 1e-5, "stored experts " + at);
    }
  }
}

// Checkpoints reshard across E (saved as at E = 1: a rank's experts are a range of the unit of
// every expert): saved at E = 2 at step 10 (ZeRO-0 and ZeRO-1), resumed at E = 1 and E = 4, the
// last 10 steps within 1e-5 of the uninterrupted E = 2 run.
TEST_F(ExpertParallel, ACheckpointSavedAtTwoResumesAtOneAndFour) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("zerod_ep_ckpt_" + std::to_string(::getpid()));
  const TinyModel m = moe_llama(kDropless);
  // Stage 0: each expert-data-parallel group's rank 0 writes its experts; stage 1: every rank
  // its shards.
  for (int stage : {0, 1}) {
    std::filesystem::remove_all(dir);
    const Outcome whole =
        train(*corpus_, m, 2, stage, "",
              R"(, "checkpoint_dir": ")" + dir.string() + R"(", "save_interval": 10)");
    ASSERT_EQ(whole.losses.size(), 20u);
    ASSERT_TRUE(std::filesystem::exists(dir / "global_step10"));
    for (int E : {1, 4}) {
      const Outcome rest =
          train(*corpus_, m, E, stage, "", R"(, "checkpoint_dir": ")" + dir.string() + R"(")",
                "global_step10");
      ASSERT_EQ(rest.losses.size(), 10u) << E;
      for (size_t i = 0; i < 10; ++i)
        EXPECT_NEAR(rest.losses[i], whole.losses[10 + i], 1e-5 * whole.losses[10 + i])
            << "stage " << stage << ", resumed at E=" << E << ", step " << 11 + i;
    }
  }
  std::filesystem::remove_all(dir);
}

// Refused while the job is checked: E not dividing the experts or the data-parallel size, a dense
// model. Every ZeRO stage is accepted.
TEST_F(ExpertParallel, BadShapesAreConfigErrorsNamingTheKeys) {
  auto problems = [&](int world, int stage, const std::string& extra, const TinyModel& model,
                      const std::string& optimizer = testing::kTinyAdamW) {
    return testing::config_problems([&] {
      testing::tiny_job(*corpus_, world, stage, 1, 1, extra, "", 8, "", model, optimizer);
    });
  };
  const TinyModel m = moe_gpt2(kDropless);
  const std::string three = problems(3, 0, R"(, "parallelism": {"expert": 3})", m);
  EXPECT_NE(
      three.find("parallelism.expert: 3 does not divide the 4 experts (model.moe.num_experts)"),
      std::string::npos)
      << three;
  const std::string dp = problems(2, 0, R"(, "parallelism": {"expert": 4})", m);
  EXPECT_NE(dp.find("parallelism.expert 4 does not divide the world size 2"), std::string::npos)
      << dp;
  const std::string dense =
      problems(4, 0, R"(, "parallelism": {"expert": 2})", testing::tiny_gpt2());
  EXPECT_NE(dense.find("parallelism.expert: 2: expert parallelism needs a model with experts"),
            std::string::npos)
      << dense;
  for (int stage : {0, 1, 2, 3})
    EXPECT_EQ(problems(4, stage, R"(, "parallelism": {"expert": 2})", m), "") << stage;
  const std::string onebit = problems(4, 0, R"(, "parallelism": {"expert": 2})", m,
                                      R"({"type": "OneBitAdam", "params": {"lr": 0.01}})");
  EXPECT_NE(onebit.find("optimizer.type: OneBitAdam does not run with parallelism.expert 2 yet"),
            std::string::npos)
      << onebit;
  for (const char* type : {"Muon", "Lamb"})
    EXPECT_EQ(problems(4, 0, R"(, "parallelism": {"expert": 2})", m,
                       std::string(R"({"type": ")") + type + R"(", "params": {"lr": 0.01}})"),
              "")
        << type;
  const std::string powersgd = problems(
      4, 0, R"(, "parallelism": {"expert": 2}, "communication_compression": {"type": "powersgd"})",
      m);
  EXPECT_NE(powersgd.find("communication_compression.type: \"powersgd\" does not run with "
                          "parallelism.expert 2 yet"),
            std::string::npos)
      << powersgd;
}

}  // namespace
}  // namespace zerod
