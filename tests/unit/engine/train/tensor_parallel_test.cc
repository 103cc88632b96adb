// Tensor parallelism through the whole trainer (threads of this process, Gloo over 127.0.0.1):
// T = 2 and T = 4, and T = 2 x DP = 2 at ZeRO stages 1-3 and with the optimizer offloaded,
// train the losses and gradient norms of one rank at the same global batch (1e-5 relative over
// 20 steps), for GPT-2 and for a Llama with grouped-query attention and an untied head; so does
// T = 2 (and 4) with Megatron's sequence parallelism, also accumulating two micro-batches at
// stage 1 and as T = 2 x DP = 2 at stage 2.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <string>

#include "train_test_util.h"

namespace zerod {
namespace {

using testing::TempCorpus;
using testing::TinyModel;

// Shapes that split 4 ways: heads, key/value heads, MLP width and the padded vocabulary.
TinyModel tp_gpt2() {
  return {"Gpt2", R"({"n_layer": 2, "n_head": 4, "n_embd": 32, "vocab_size": 256, "seq_len": 24})"};
}
TinyModel tp_llama() {
  return {"Llama", R"({"type": "llama", "hidden_size": 32, "intermediate_size": 48,
                       "num_hidden_layers": 2, "num_attention_heads": 8,
                       "num_key_value_heads": 4, "vocab_size": 123, "rms_norm_eps": 1e-5,
                       "tie_word_embeddings": false, "seq_len": 16})"};
}

class TensorParallel : public ::testing::TestWithParam<TinyModel> {
 protected:
  static void SetUpTestSuite() { corpus_ = new TempCorpus("zerod_tp"); }
  static void TearDownTestSuite() {
    delete corpus_;
    corpus_ = nullptr;
  }

  struct Run {
    int world = 1;
    int tensor = 1;
    int stage = 0;
    std::string zero_extra = "";
    bool sequence = false;  // parallelism.sequence_parallel
    int accum = 1;          // gradient_accumulation_steps
  };
  struct Outcome {
    std::vector<double> losses, norms;
    std::vector<double> rank_last_loss;  // every rank's last loss
    int data_parallel = 0;
    std::vector<std::vector<int>> tensor_groups;  // as rank 0 sees its groups
  };

  Outcome train(const Run& r) const {
    const std::string extra = r.tensor > 1
                                  ? R"(, "parallelism": {"tensor": )" + std::to_string(r.tensor) +
                                        (r.sequence ? R"(, "sequence_parallel": true)" : "") + "}"
                                  : "";
    const JobConfig cfg = testing::tiny_job(*corpus_, r.world, r.stage, r.accum, 20, extra, "", 8,
                                            r.zero_extra, GetParam());
    EXPECT_EQ(cfg.parallelism.sequence_parallel, r.sequence);
    Outcome out;
    out.rank_last_loss.resize(static_cast<size_t>(r.world));
    std::mutex mu;
    testing::run_world(r.world, [&](const RankContext& ctx) {
      Trainer t(cfg, ctx, testing::quiet_trainer());
      const TrainResult res = t.run();
      std::lock_guard<std::mutex> lock(mu);
      out.rank_last_loss[static_cast<size_t>(ctx.rank)] = res.steps.back().loss;
      if (ctx.rank == 0) {
        out.data_parallel = t.groups().zero().size();
        out.tensor_groups.push_back(t.groups().tensor().ranks());
        for (const auto& s : res.steps) {
          out.losses.push_back(s.loss);
          out.norms.push_back(s.grad_norm);
        }
      }
    });
    return out;
  }

  static void expect_close(const std::vector<double>& a, const std::vector<double>& b, double rel,
                           const std::string& what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_NEAR(a[i], b[i], rel * std::abs(a[i])) << what << ", step " << i + 1;
  }

  static TempCorpus* corpus_;
};

TempCorpus* TensorParallel::corpus_ = nullptr;

TEST_P(TensorParallel, TensorTwoAndFourTrainTheLossesOfOneRank) {
  const Outcome single = train({.world = 1});
  ASSERT_EQ(single.losses.size(), 20u);
  EXPECT_LT(single.losses.back(), single.losses.front());  // it trains
  for (int T : {2, 4}) {
    const Outcome tp = train({.world = T, .tensor = T});
    EXPECT_EQ(tp.data_parallel, 1);
    ASSERT_EQ(tp.tensor_groups.size(), 1u);
    EXPECT_EQ(static_cast<int>(tp.tensor_groups[0].size()), T);
    expect_close(tp.losses, single.losses, 1e-5, "T=" + std::to_string(T) + " loss");
    expect_close(tp.norms, single.norms, 1e-5, "T=" + std::to_string(T) + " grad norm");
    for (double l : tp.rank_last_loss) EXPECT_NEAR(l, tp.losses.back(), 1e-6 * l);
  }
}

TEST_P(TensorParallel, TensorTwoTimesDataTwoAtEveryStageAndOffloaded) {
  const Outcome single = train({.world = 1});
  for (int stage : {1, 2, 3}) {
    const Outcome o = train({.world = 4, .tensor = 2, .stage = stage});
    EXPECT_EQ(o.data_parallel, 2);
    EXPECT_EQ(o.tensor_groups[0], (std::vector<int>{0, 1}));  // tensor fastest
    expect_close(o.losses, single.losses, 1e-5, "T=2 x DP=2 stage " + std::to_string(stage));
    expect_close(o.norms, single.norms, 1e-5, "T=2 x DP=2 norm, stage " + std::to_string(stage));
  }
  const Outcome off = train({.world = 4,
                             .tensor = 2,
                             .stage = 2,
                             .zero_extra = R"(, "offload_optimizer": {"device": "cpu"})"});
  expect_close(off.losses, single.losses, 1e-5, "T=2 x DP=2 stage 2, optimizer offloaded");
}

// Sequence parallelism: the norm and residual regions split along the B x T rows (all-gather
// into and reduce-scatter out of the tensor-parallel regions, the norms' partial gradients summed
// over the tensor group, also while gradients accumulate).
TEST_P(TensorParallel, SequenceParallelTrainsTheLossesOfOneRank) {
  const Outcome single = train({.world = 1});
  for (int T : {2, 4}) {
    const Outcome sp = train({.world = T, .tensor = T, .sequence = true});
    EXPECT_EQ(sp.data_parallel, 1);
    const std::string what = "T=" + std::to_string(T) + " with SP";
    expect_close(sp.losses, single.losses, 1e-5, what + " loss");
    expect_close(sp.norms, single.norms, 1e-5, what + " grad norm");
    for (double l : sp.rank_last_loss) EXPECT_NEAR(l, sp.losses.back(), 1e-6 * l);
  }
  const Outcome dp = train({.world = 4, .tensor = 2, .stage = 2, .sequence = true});
  EXPECT_EQ(dp.data_parallel, 2);
  expect_close(dp.losses, single.losses, 1e-5, "T=2 with SP x DP=2 stage 2 loss");
  expect_close(dp.norms, single.norms, 1e-5, "T=2 with SP x DP=2 stage 2 grad norm");
  // Two micro-batches accumulated in ZeRO's full gradient buffer (stage 1).
  const Outcome single2 = train({.world = 1, .accum = 2});
  const Outcome acc = train({.world = 2, .tensor = 2, .stage = 1, .sequence = true, .accum = 2});
  expect_close(acc.losses, single2.losses, 1e-5, "T=2 with SP, 2 micro-batches, loss");
  expect_close(acc.norms, single2.norms, 1e-5, "T=2 with SP, 2 micro-batches, grad norm");
}

INSTANTIATE_TEST_SUITE_P(Models, TensorParallel, ::testing::Values(tp_gpt2(), tp_llama()),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace zerod
