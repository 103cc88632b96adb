// offload_optimizer device cpu on the CPU backend: the fp32 master weights and Adam moments
// leave the compute pool for host memory (the accounting shows it), and the losses are
// bit-identical to the same run without offload, at stages 1, 2 and 3, in fp32 and bf16, for
// GPT-2 and for a Llama (grouped-query attention, untied output head).
#include <gtest/gtest.h>

#include <mutex>

#include "train_test_util.h"

namespace zerod {
namespace {

class OffloadCpu : public ::testing::TestWithParam<testing::TinyModel> {};

TEST_P(OffloadCpu, SameLossesAndTheStatesLeaveTheComputePool) {
  testing::TempCorpus corpus("zerod_offload_cpu_corpus");
  for (const std::string dtype : {"", R"(, "bf16": {"enabled": true})"}) {
    for (int stage : {1, 2, 3}) {
      std::vector<double> losses[2];
      ModelStateBytes measured[2], formula[2];
      for (int off = 0; off < 2; ++off) {
        JobConfig cfg = testing::tiny_job(corpus, 2, stage, 2, 4, dtype, "", 8, "", GetParam());
        if (off) cfg.zero.offload_optimizer.device = OffloadDevice::kCpu;
        std::mutex mu;
        testing::run_world(2, [&](const RankContext& ctx) {
          Trainer t(cfg, ctx, testing::quiet_trainer());
          const TrainResult r = t.run();
          if (ctx.rank != 0) return;
          std::lock_guard<std::mutex> lock(mu);
          for (const auto& s : r.steps) losses[off].push_back(s.loss);
          measured[off] = t.engine().measured_bytes();
          formula[off] = t.engine().formula_bytes();
        });
      }
      const std::string what =
          "stage " + std::to_string(stage) + (dtype.empty() ? " fp32" : " bf16");
      ASSERT_EQ(losses[0].size(), 4u) << what;
      EXPECT_EQ(losses[0], losses[1]) << what;  // bit-identical
      // The optimizer states left the compute pool ...
      EXPECT_EQ(measured[1].master, 0) << what;
      EXPECT_EQ(measured[1].moments, 0) << what;
      EXPECT_EQ(measured[1].weights, measured[0].weights) << what;
      EXPECT_EQ(measured[1].gradients, measured[0].gradients) << what;
      // ... for host memory: moments, plus a separate fp32 master (fp32 no longer aliases the
      // weights), as the formula says.
      EXPECT_EQ(measured[1].host, measured[0].moments + (dtype.empty() ? measured[0].moments / 2
                                                                       : measured[0].master))
          << what;
      EXPECT_NEAR(static_cast<double>(measured[1].host), static_cast<double>(formula[1].host),
                  0.1 * static_cast<double>(formula[1].host))
          << what;
      EXPECT_EQ(formula[1].master + formula[1].moments, 0) << what;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, OffloadCpu,
                         ::testing::Values(testing::tiny_gpt2(), testing::tiny_llama()),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace zerod
