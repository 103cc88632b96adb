// OneBitAdam (zero/onebit.h) trained end to end on two ranks (threads, Gloo on 127.0.0.1):
// with freeze_step past the run it is Adam without bias correction bit for bit; after the
// freeze the gradients are not all-reduced and the comms logger's bytes per step drop by more
// than 16x; a resume after the freeze continues bitwise (the worker and server errors are in
// the checkpoint: without them the curve differs).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>

#include "comm/collective_log.h"
#include "tests/unit/engine/train/train_test_util.h"

namespace zerod {
namespace {

namespace fs = std::filesystem;
using testing::quiet_trainer;
using testing::run_world;
using testing::TempCorpus;
using testing::tiny_job;

std::string onebit(int freeze_step, const std::string& type = "OneBitAdam") {
  return R"({"type": ")" + type + R"(", "params": {"lr": 2e-3, "betas": [0.9, 0.95],
             "weight_decay": 0.1, "freeze_step": )" +
         std::to_string(freeze_step) + "}}";
}
constexpr const char* kAdamNoBiasCorrection =
    R"({"type": "AdamW", "params": {"lr": 2e-3, "betas": [0.9, 0.95], "weight_decay": 0.1,
        "bias_correction": false}})";

class OnebitTraining : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { corpus_ = new TempCorpus("zerod_onebit_corpus"); }
  static void TearDownTestSuite() { delete corpus_; }
  void SetUp() override {
    ckpt_ = fs::temp_directory_path() / ("zerod_onebit_ckpt_" + std::to_string(::getpid()));
    fs::remove_all(ckpt_);
  }
  void TearDown() override { fs::remove_all(ckpt_); }

  struct Run {
    std::vector<double> losses;
    // Rank 0's collective totals after each step (bytes by operation).
    std::vector<std::map<std::string, CollectiveTotals>> totals;
  };
  Run run(const std::string& optimizer, int steps, int save_interval = 0,
          const std::string& resume = "", const std::string& extra = "", int world = 2,
          const testing::TinyModel& model = testing::tiny_gpt2()) {
    std::string train_extra;
    if (save_interval > 0 || !resume.empty())
      train_extra = R"(, "checkpoint_dir": ")" + ckpt_.string() + R"(", "save_interval": )" +
                    std::to_string(save_interval);
    const JobConfig cfg =
        tiny_job(*corpus_, world, 0, 1, steps, extra, train_extra, 8, "", model, optimizer);
    Run out;
    std::mutex mu;
    run_world(world, [&](const RankContext& ctx) {
      TrainerOptions o = quiet_trainer();
      if (ctx.rank == 0) {
        o.on_step = [&](const StepMetrics&) {
          if (const CollectiveLog* log = ctx.comm ? ctx.comm->collective_log() : nullptr)
            out.totals.push_back(log->totals());  // (world 1: none)
        };
      }
      Trainer t(cfg, ctx, o);
      if (!resume.empty()) t.resume(resume);
      const TrainResult res = t.run();
      if (ctx.rank != 0) return;
      std::lock_guard<std::mutex> lock(mu);
      for (const auto& s : res.steps) out.losses.push_back(s.loss);
    });
    return out;
  }

  static TempCorpus* corpus_;
  fs::path ckpt_;
};
TempCorpus* OnebitTraining::corpus_ = nullptr;

TEST_F(OnebitTraining, WithFreezeStepPastTheRunItIsAdamWithoutBiasCorrection) {
  for (const std::string& extra : {std::string(), std::string(R"(, "bf16": {"enabled": true})")}) {
    const Run adam = run(kAdamNoBiasCorrection, 6, 0, "", extra);
    const Run ob = run(onebit(100), 6, 0, "", extra);
    ASSERT_EQ(ob.losses.size(), 6u);
    EXPECT_EQ(ob.losses, adam.losses) << extra;
    EXPECT_LT(ob.losses.back(), ob.losses.front());
  }
}

// Bytes each rank sends per step, by the logger's counts: NCCL's size convention (bytes) and on
// the wire (bytes x the bus factor: an all-reduce sends 2(n-1)/n of its buffer).
struct StepBytes {
  double size = 0, wire = 0;
  std::map<std::string, double> by_op;
};
StepBytes bytes_between(const std::map<std::string, CollectiveTotals>& a,
                        const std::map<std::string, CollectiveTotals>& b, int steps) {
  CollectiveLog factors(2);
  StepBytes s;
  for (const auto& [op, t] : b) {
    const int64_t before = a.count(op) ? a.at(op).bytes : 0;
    const double per = static_cast<double>(t.bytes - before) / steps;
    s.by_op[op] = per;
    s.size += per;
    s.wire += per * factors.bus_factor(op);
  }
  return s;
}

TEST_F(OnebitTraining, AfterTheFreezeBytesPerStepDropMoreThan16x) {
  const Run r = run(onebit(3), 8);
  ASSERT_EQ(r.totals.size(), 8u);
  // Warm-up: steps 2-3 (step 1 also carries start-up collectives); compressed: steps 5-8.
  StepBytes warm = bytes_between(r.totals[0], r.totals[2], 2);
  StepBytes comp = bytes_between(r.totals[3], r.totals[7], 4);
  std::printf(
      "warm-up bytes/step: size %.0f, wire %.0f; compressed: size %.0f, wire %.0f "
      "(all_to_all %.0f, all_gather %.0f, all_reduce %.0f); ratio size %.2fx, wire "
      "%.2fx\n",
      warm.size, warm.wire, comp.size, comp.wire, comp.by_op["all_to_all"],
      comp.by_op["all_gather"], comp.by_op["all_reduce"], warm.size / comp.size,
      warm.wire / comp.wire);
  EXPECT_GE(warm.wire / comp.wire, 16.0);
  EXPECT_GT(warm.size / comp.size, 15.0);
  // Past the freeze only scalars are all-reduced (the norm and the loss).
  EXPECT_LT(comp.by_op["all_reduce"], 64.0);
  EXPECT_GT(comp.by_op["all_to_all"], 0.0);
}

TEST_F(OnebitTraining, ResumeAfterTheFreezeIsBitwise) {
  const Run whole = run(onebit(3), 9, 5);
  ASSERT_EQ(whole.losses.size(), 9u);
  const Run rest = run(onebit(3), 9, 0, "global_step5");
  ASSERT_EQ(rest.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(rest.losses[i], whole.losses[5 + i]) << "step " << 6 + i;
  // The errors matter: without their files the run goes on (a warning) but not the same way.
  for (int r = 0; r < 2; ++r)
    ASSERT_TRUE(fs::remove(ckpt_ / "global_step5" / ("onebit_rank" + std::to_string(r) + ".bin")));
  const Run reset = run(onebit(3), 9, 0, "global_step5");
  ASSERT_EQ(reset.losses.size(), 4u);
  EXPECT_NE(reset.losses, rest.losses);
}

// OneBitLamb: its LAMB warm-up and compressed steps train (the loss falls past the freeze), the
// bytes after the freeze drop as OneBitAdam's, and a resume after the freeze is bitwise (the
// frozen coefficients and the fresh variance in onebit_state.bin, the errors per rank); without
// onebit_state.bin the resume is refused.
TEST_F(OnebitTraining, OnebitLambTrainsAndResumesBitwise) {
  // (LAMB's steps are lr x ||p|| per tensor: a larger lr than Adam's.)
  const std::string lamb = R"({"type": "OneBitLamb", "params": {"lr": 0.05, "betas": [0.9, 0.95],
                               "weight_decay": 0.1, "freeze_step": 3}})";
  const Run whole = run(lamb, 9, 5);
  ASSERT_EQ(whole.losses.size(), 9u);
  for (double l : whole.losses) ASSERT_TRUE(std::isfinite(l));
  EXPECT_LT(whole.losses.back(), whole.losses[3]) << ::testing::PrintToString(whole.losses);
  const StepBytes warm = bytes_between(whole.totals[0], whole.totals[2], 2);
  const StepBytes comp = bytes_between(whole.totals[3], whole.totals[8], 5);
  EXPECT_GE(warm.wire / comp.wire, 16.0);
  const Run rest = run(lamb, 9, 0, "global_step5");
  ASSERT_EQ(rest.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(rest.losses[i], whole.losses[5 + i]) << "step " << 6 + i;
  ASSERT_TRUE(fs::remove(ckpt_ / "global_step5" / "onebit_state.bin"));
  EXPECT_THROW(run(lamb, 9, 0, "global_step5"), InputError);
}

// ZeroOneAdam (0/1 Adam): var_freeze_step 4 with var_update_scaler 2 (variance steps 1-3 on
// all-reduced gradients, step 4 on compressed ones), then local steps whose interval doubles
// every step (local_step_scaler 1) up to local_step_clipper 4: synchronisations at steps 5, 7,
// 11, 15, ... It trains (the loss falls); bytes per step against AdamW's on the same job; a
// resume between two synchronisations (step 9) is bitwise, and without the rank files it is not.
// (With var_update_scaler 1 the compressed gradient of step 2 meets a variance of one step and
// the loss jumps from 5.5 to 27 at step 3: the schedule is the algorithm's, DeepSpeed's default
// is 16.)
std::string zeroone() {
  return R"({"type": "ZeroOneAdam", "params": {"lr": 2e-3, "betas": [0.9, 0.95],
             "weight_decay": 0.1, "var_freeze_step": 4, "var_update_scaler": 2,
             "local_step_scaler": 1, "local_step_clipper": 4}})";
}

TEST_F(OnebitTraining, ZeroOneAdamBytesPerStepAgainstAdam) {
  const Run adam = run(kAdamNoBiasCorrection, 4);
  const Run zo = run(zeroone(), 15);
  ASSERT_EQ(zo.totals.size(), 15u);
  for (double l : zo.losses) ASSERT_TRUE(std::isfinite(l));
  EXPECT_LT(zo.losses.back(), zo.losses.front());
  const StepBytes a = bytes_between(adam.totals[0], adam.totals[3], 3);      // steps 2-4
  const StepBytes var = bytes_between(zo.totals[0], zo.totals[3], 3);        // steps 2-4
  const StepBytes frozen = bytes_between(zo.totals[6], zo.totals[14], 8);    // steps 8-15: 2 syncs
  const StepBytes one_sync = bytes_between(zo.totals[9], zo.totals[10], 1);  // step 11
  const StepBytes local = bytes_between(zo.totals[7], zo.totals[8], 1);      // step 9
  std::printf(
      "bytes/step on the wire (NCCL size convention): AdamW %.0f (%.0f); ZeroOneAdam variance "
      "phase, steps 2-4, %.0f (%.0f); after the freeze, steps 8-15, %.0f (%.0f): a "
      "synchronisation %.0f (%.0f), a local step %.0f (%.0f); AdamW / ZeroOneAdam after the "
      "freeze %.1fx on the wire (%.1fx)\n",
      a.wire, a.size, var.wire, var.size, frozen.wire, frozen.size, one_sync.wire, one_sync.size,
      local.wire, local.size, a.wire / frozen.wire, a.size / frozen.size);
  // A synchronisation moves as much as OneBitAdam's compressed step (>= 16x below AdamW on the
  // wire), a local step only scalars (the norm, the loss), and with one synchronisation every 4
  // steps at least 64x.
  EXPECT_GE(a.wire / one_sync.wire, 16.0);
  EXPECT_LT(local.size, 64.0);
  EXPECT_GE(a.wire / frozen.wire, 64.0);
  // The variance phase: steps 2 and 3 all-reduce, step 4 compresses.
  EXPECT_LT(var.wire, a.wire);
  EXPECT_GT(var.by_op.at("all_to_all"), 0.0);
}

TEST_F(OnebitTraining, ZeroOneAdamResumeBetweenSynchronisationsIsBitwise) {
  const Run whole = run(zeroone(), 14, 9);
  ASSERT_EQ(whole.losses.size(), 14u);
  const Run rest = run(zeroone(), 14, 0, "global_step9");
  ASSERT_EQ(rest.losses.size(), 5u);
  for (size_t i = 0; i < 5; ++i)
    EXPECT_EQ(rest.losses[i], whole.losses[9 + i]) << "step " << 10 + i;
  // Without the rank files (the ranks' own weights, the accumulator, the counters) the run goes
  // on from rank 0's weights with a warning, differently.
  for (int r = 0; r < 2; ++r)
    ASSERT_TRUE(fs::remove(ckpt_ / "global_step9" / ("onebit_rank" + std::to_string(r) + ".bin")));
  const Run reset = run(zeroone(), 14, 0, "global_step9");
  ASSERT_EQ(reset.losses.size(), 5u);
  EXPECT_NE(reset.losses, rest.losses);
}

// Tensor and context parallelism (each rank compresses its own slices of the momentum over its
// data-parallel group, as Megatron-DeepSpeed's 1-bit optimizers see a tensor rank's parameters):
// - T=2 over one data-parallel rank: nothing to compress, so past the freeze both OneBitAdam and
//   ZeroOneAdam take the single rank's steps (frozen variance, local momentum, the slices' masks,
//   the replicated tensors' gradients summed over the tensor group): its losses within 1e-5;
// - C=2: the warm-up is AdamW without bias correction bit for bit, and past the freeze it learns;
// - T=2 x DP=2: learns past the freeze and resumes after it bit for bit; so does OneBitLamb learn.
TEST_F(OnebitTraining, TensorAndContextParallelism) {
  const std::string tp2 = R"(, "parallelism": {"tensor": 2})";
  for (const std::string& opt : {onebit(2), zeroone()}) {
    const Run single = run(opt, 6, 0, "", "", 1, testing::tiny_llama());
    const Run tp = run(opt, 6, 0, "", tp2, 2, testing::tiny_llama());
    ASSERT_EQ(tp.losses.size(), 6u);
    for (size_t i = 0; i < 6; ++i)
      EXPECT_NEAR(tp.losses[i], single.losses[i], 1e-5 * single.losses[i]) << opt << i;
    EXPECT_LT(single.losses.back(), single.losses.front());
  }
  const std::string cp2 = R"(, "parallelism": {"context": 2})";
  EXPECT_EQ(run(onebit(100), 6, 0, "", cp2).losses,
            run(kAdamNoBiasCorrection, 6, 0, "", cp2).losses);
  const Run cp = run(onebit(2), 8, 0, "", cp2);
  ASSERT_EQ(cp.losses.size(), 8u);
  EXPECT_LT(cp.losses.back(), cp.losses[2]) << ::testing::PrintToString(cp.losses);
  const Run whole = run(onebit(2), 8, 4, "", tp2, 4, testing::tiny_llama());
  ASSERT_EQ(whole.losses.size(), 8u);
  EXPECT_LT(whole.losses.back(), whole.losses[2]) << ::testing::PrintToString(whole.losses);
  const Run rest = run(onebit(2), 8, 0, "global_step4", tp2, 4, testing::tiny_llama());
  EXPECT_EQ(rest.losses, std::vector<double>(whole.losses.begin() + 4, whole.losses.end()));
  // OneBitLamb (trust ratios per slice; the freeze's mean momentum scale over the tensor group).
  const Run lamb = run(R"({"type": "OneBitLamb", "params": {"lr": 0.05, "betas": [0.9, 0.95],
                          "weight_decay": 0.1, "freeze_step": 2}})",
                       8, 0, "", tp2, 4, testing::tiny_llama());
  ASSERT_EQ(lamb.losses.size(), 8u);
  for (double l : lamb.losses) ASSERT_TRUE(std::isfinite(l));
  EXPECT_LT(lamb.losses.back(), lamb.losses[2]) << ::testing::PrintToString(lamb.losses);
}

}  // namespace
}  // namespace zerod
