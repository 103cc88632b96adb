// The host-memory preflight: a CPU job that would not fit is refused before it allocates
// (exit 2), with its planned bytes, what is available and from where, and the nearest settings
// that fit; a job that fits starts.
#include "engine/train/memory_preflight.h"

#include <gtest/gtest.h>

#include <string>

#include "engine/config/model_spec.h"
#include "train_test_util.h"

namespace zerod {
namespace {

using testing::TempCorpus;

class MemoryPreflight : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { corpus_ = new TempCorpus("zerod_mem_preflight"); }
  static void TearDownTestSuite() {
    delete corpus_;
    corpus_ = nullptr;
  }
  // The refusal message of constructing a Trainer for cfg ("" when it starts).
  static std::string refusal(const JobConfig& cfg) {
    std::string msg;
    testing::run_world(cfg.world_size, [&](const RankContext& ctx) {
      try {
        Trainer t(cfg, ctx, testing::quiet_trainer());
      } catch (const InputError& e) {
        EXPECT_EQ(e.exit_code(), 2);
        if (ctx.rank == 0) msg = e.what();
      }
    });
    return msg;
  }
  static TempCorpus* corpus_;
};
TempCorpus* MemoryPreflight::corpus_ = nullptr;

TEST_F(MemoryPreflight, AJobOverTheLimitIsRefusedWithTheNumbersAndWhatFits) {
  // micro-batch 8 of 24 tokens: activations dominate this model's ~0.6 MiB.
  JobConfig cfg = testing::tiny_job(*corpus_, 1, 0, 1, 2, "", "", 8);
  EXPECT_EQ(refusal(cfg), "");       // it fits the machine
  cfg.train.memory_limit = 1 << 20;  // 1 MiB: the model states fit, the activations do not
  const std::string msg = refusal(cfg);
  EXPECT_NE(msg.find("this job needs about"), std::string::npos) << msg;
  EXPECT_NE(msg.find("of host memory in this process (1 rank x"), std::string::npos) << msg;
  EXPECT_NE(msg.find("but 1.0 MiB is available (train.memory_limit (--memory-limit))"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("settings that fit:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("train_micro_batch_size_per_gpu"), std::string::npos) << msg;
  // Two ranks in one process need twice as much, and say so.
  JobConfig two = testing::tiny_job(*corpus_, 2, 0, 1, 2, "", "", 8);
  two.train.memory_limit = 1 << 20;
  EXPECT_NE(refusal(two).find("(2 ranks x"), std::string::npos);
}

// A pipeline job is judged by its largest stage (the pipeline plan's model states and the
// activations of the micro-batches its schedule keeps live), not by the whole model.
TEST_F(MemoryPreflight, APipelineJobIsJudgedByItsLargestStage) {
  JobConfig cfg = testing::tiny_job(*corpus_, 2, 0, 4, 2, R"(, "parallelism": {"pipeline": 2})", "",
                                    8, "", testing::tiny_gpt2_4layers());
  EXPECT_EQ(refusal(cfg), "");
  cfg.train.memory_limit = 64 << 10;
  const std::string msg = refusal(cfg);
  EXPECT_NE(msg.find("this pipeline job needs about"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(2 ranks x up to"), std::string::npos) << msg;
  EXPECT_NE(msg.find("pipeline rank 0's model states"), std::string::npos) << msg;
  EXPECT_NE(msg.find("but 64.0 KiB is available"), std::string::npos) << msg;
}

TEST_F(MemoryPreflight, AModelFarTooLargeForTheMachineIsRefusedBeforeAnyAllocation) {
  // GPT-2 with n_embd 2^20: petabytes of weights. Refused from MemAvailable alone, at once.
  JobConfig cfg = testing::tiny_job(
      *corpus_, 1, 0, 1, 2, "", "", 8, "",
      {"Huge", R"({"n_layer": 2, "n_head": 16, "n_embd": 1048576, "vocab_size": 256,
                   "seq_len": 24})"});
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = refusal(cfg);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  EXPECT_NE(msg.find("this job needs about"), std::string::npos) << msg;
  EXPECT_NE(msg.find("TiB") == std::string::npos ? msg.find("GiB") : msg.find("TiB"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("use more ranks or nodes, or a smaller model"), std::string::npos) << msg;
}

TEST_F(MemoryPreflight, AvailableMemoryIsTheSmallestOfMachineCgroupAndLimit) {
  const HostMemory none = host_memory_available(0);
  EXPECT_GT(none.bytes, 0);
  const HostMemory limited = host_memory_available(12345);
  EXPECT_EQ(limited.bytes, 12345);
  EXPECT_EQ(limited.source, "train.memory_limit (--memory-limit)");
  const HostMemory loose = host_memory_available(int64_t{1} << 60);
  EXPECT_EQ(loose.bytes, none.bytes);
}

}  // namespace
}  // namespace zerod
