// Context parallelism through the whole trainer (threads of this process, Gloo over 127.0.0.1):
// C = 2 with Ulysses and with ring attention, T = 2 x C = 2 (tensor fastest; Ulysses splitting a
// tensor rank's heads; ring also with Megatron's sequence parallelism), and C = 2 x DP = 2 at
// ZeRO stage 2 (ZeRO shards over data x context) train the losses and gradient norms of one rank
// at the same global batch (1e-5 relative over 20 steps, gradient clipping on), for GPT-2 and a
// Llama with grouped-query attention and an untied head. Every rank of a context group reads the
// same micro-batches and reports the loss of all their positions. A sequence that does not split
// into 2C chunks, or heads Ulysses cannot split, are refused before training, naming the numbers.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <string>

#include "engine/config/config_error.h"
#include "train_test_util.h"

namespace zerod {
namespace {

using testing::TempCorpus;
using testing::TinyModel;

class ContextParallel : public ::testing::TestWithParam<TinyModel> {
 protected:
  static void SetUpTestSuite() { corpus_ = new TempCorpus("zerod_cp"); }
  static void TearDownTestSuite() {
    delete corpus_;
    corpus_ = nullptr;
  }

  struct Run {
    int world = 1;
    int context = 1;
    std::string impl = "ulysses";
    int tensor = 1;
    bool sequence = false;  // parallelism.sequence_parallel
    int stage = 0;
  };
  struct Outcome {
    std::vector<double> losses, norms;
    std::vector<double> rank_last_loss;  // every rank's last loss
    int zero_size = 0;
    std::vector<int> context_group;  // rank 0's
  };

  static std::string parallelism(const Run& r) {
    if (r.context == 1 && r.tensor == 1) return "";
    return R"(, "parallelism": {"tensor": )" + std::to_string(r.tensor) + R"(, "context": )" +
           std::to_string(r.context) + R"(, "context_impl": ")" + r.impl + "\"" +
           (r.sequence ? R"(, "sequence_parallel": true)" : "") + "}";
  }

  Outcome train(const Run& r) const {
    const JobConfig cfg =
        testing::tiny_job(*corpus_, r.world, r.stage, 1, 20, parallelism(r), "", 8, "", GetParam());
    EXPECT_EQ(cfg.parallelism.context, r.context);
    EXPECT_NO_THROW(check_supported(cfg));
    Outcome out;
    out.rank_last_loss.resize(static_cast<size_t>(r.world));
    std::mutex mu;
    testing::run_world(r.world, [&](const RankContext& ctx) {
      Trainer t(cfg, ctx, testing::quiet_trainer());
      const TrainResult res = t.run();
      std::lock_guard<std::mutex> lock(mu);
      out.rank_last_loss[static_cast<size_t>(ctx.rank)] = res.steps.back().loss;
      if (ctx.rank == 0) {
        out.zero_size = t.groups().zero().size();
        out.context_group = t.groups().context().ranks();
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

TempCorpus* ContextParallel::corpus_ = nullptr;

TEST_P(ContextParallel, UlyssesAndRingTrainTheLossesOfOneRank) {
  const Outcome single = train({});
  ASSERT_EQ(single.losses.size(), 20u);
  EXPECT_LT(single.losses.back(), single.losses.front());  // it trains
  for (const char* impl : {"ulysses", "ring"}) {
    const Outcome cp = train({.world = 2, .context = 2, .impl = impl});
    EXPECT_EQ(cp.zero_size, 2);  // ZeRO over data x context
    EXPECT_EQ(cp.context_group, (std::vector<int>{0, 1}));
    const std::string what = std::string("C=2 ") + impl;
    expect_close(cp.losses, single.losses, 1e-5, what + " loss");
    expect_close(cp.norms, single.norms, 1e-5, what + " grad norm");
    for (double l : cp.rank_last_loss) EXPECT_NEAR(l, cp.losses.back(), 1e-6 * l);
  }
}

TEST_P(ContextParallel, TensorTwoTimesContextTwo) {
  const Outcome single = train({});
  const Outcome u = train({.world = 4, .context = 2, .impl = "ulysses", .tensor = 2});
  EXPECT_EQ(u.context_group, (std::vector<int>{0, 2}));  // tensor fastest, then context
  expect_close(u.losses, single.losses, 1e-5, "T=2 x C=2 ulysses loss");
  expect_close(u.norms, single.norms, 1e-5, "T=2 x C=2 ulysses grad norm");
  const Outcome r =
      train({.world = 4, .context = 2, .impl = "ring", .tensor = 2, .sequence = true, .stage = 1});
  expect_close(r.losses, single.losses, 1e-5, "T=2 with SP x C=2 ring, stage 1, loss");
  expect_close(r.norms, single.norms, 1e-5, "T=2 with SP x C=2 ring, stage 1, grad norm");
}

TEST_P(ContextParallel, ContextTwoTimesDataTwoAtStageTwo) {
  const Outcome single = train({});
  for (const char* impl : {"ulysses", "ring"}) {
    const Outcome o = train({.world = 4, .context = 2, .impl = impl, .stage = 2});
    EXPECT_EQ(o.zero_size, 4);
    EXPECT_EQ(o.context_group, (std::vector<int>{0, 1}));
    const std::string what = std::string("C=2 x DP=2 stage 2 ") + impl;
    expect_close(o.losses, single.losses, 1e-5, what + " loss");
    expect_close(o.norms, single.norms, 1e-5, what + " grad norm");
    for (double l : o.rank_last_loss) EXPECT_NEAR(l, o.losses.back(), 1e-6 * l);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ContextParallel,
                         ::testing::Values(testing::tiny_gpt2_split4(),
                                           testing::tiny_llama_split4()),
                         [](const auto& info) { return std::string(info.param.name); });

// Refused while the job is checked: a sequence that does not split into 2C chunks (24 positions,
// C = 5), and Ulysses over more ranks than a tensor rank's key/value heads (C = 4 with 4 key/value
// heads over tensor 2); ring takes the latter.
TEST(ContextParallelJob, BadShapesAreConfigErrorsNamingTheNumbers) {
  TempCorpus corpus("zerod_cp_bad");
  auto problems = [&](int world, const std::string& extra, const TinyModel& model) {
    return testing::config_problems(
        [&] { testing::tiny_job(corpus, world, 0, 1, 1, extra, "", world, "", model); });
  };
  const std::string seq = problems(5, R"(, "parallelism": {"context": 5, "context_impl": "ring"})",
                                   testing::tiny_gpt2_split4());
  EXPECT_NE(seq.find("parallelism.context: 5: a sequence of 24 positions (model.seq_len) does not "
                     "split into 2 x 5 = 10 equal chunks"),
            std::string::npos)
      << seq;
  const std::string heads =
      problems(8, R"(, "parallelism": {"tensor": 2, "context": 4})", testing::tiny_llama_split4());
  EXPECT_NE(heads.find("parallelism.context: 4 (ulysses) does not divide the 2 key/value heads "
                       "per tensor rank"),
            std::string::npos)
      << heads;
  EXPECT_EQ(problems(8, R"(, "parallelism": {"tensor": 2, "context": 4, "context_impl": "ring"})",
                     testing::tiny_llama_split4()),
            "");
}

}  // namespace
}  // namespace zerod
