// Every parallel dimension on device memory, checked on the CPU: each rank (a thread) trains on a
// StrictDeviceBackend of its own, whose memory faults on any host access outside its ops and
// copies, and the process groups move the ranks' device tensors through host staging
// (comm/staged/; Trainer::device_tensors). Data parallelism at ZeRO 1 and 3 (with the optimizer
// states on the host), tensor parallelism with sequence parallelism, context parallelism (ring and
// Ulysses, and with tensor parallelism), pipelines (1F1B, zero-bubble, interleaved, with tensor
// parallelism), PowerSGD, Muon and the 1-bit optimizers must give the CPU backend's losses and
// gradient norms bit for bit: the same kernels on the same values, so any difference is a tensor
// that went the wrong way between host and device.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "tests/unit/engine/train/strict_device_backend.h"
#include "tests/unit/engine/train/train_test_util.h"

namespace zerod::test {
namespace {

struct Case {
  const char* name;
  int world;
  int stage;
  std::string extra;  // top-level members of the job
  testing::TinyModel model;
  std::string optimizer = testing::kTinyAdamW;
  std::string zero_extra;
  int accum = 2;
  bool bf16 = false;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

std::string parallelism(const std::string& members);

struct Outcome {
  std::vector<double> losses, norms;  // rank 0's, per step
  std::vector<double> last;           // every rank's last loss
  int64_t staged = 0;                 // rank 0's backend copies (device runs)
};

class DeviceGroups : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() { corpus_ = new testing::TempCorpus("zerod_device_groups"); }
  static void TearDownTestSuite() { delete corpus_; }

  static Outcome train(const Case& c, bool strict) {
    std::string extra = c.extra;
    if (c.bf16) extra += R"(, "bf16": {"enabled": true})";
    const JobConfig cfg = testing::tiny_job(*corpus_, c.world, c.stage, c.accum, 6, extra, "", 8,
                                            c.zero_extra, c.model, c.optimizer);
    Outcome out;
    out.last.resize(static_cast<size_t>(c.world));
    std::mutex mu;
    testing::run_world(c.world, [&](const RankContext& ctx) {
      TrainerOptions o = testing::quiet_trainer();
      StrictDeviceBackend* device = nullptr;
      if (strict) {
        o.backend = [&] {
          auto be = std::make_unique<StrictDeviceBackend>(cfg.compute_dtype());
          device = be.get();
          return be;
        };
      }
      Trainer t(cfg, ctx, o);
      const TrainResult res = t.run();
      std::lock_guard<std::mutex> lock(mu);
      out.last[static_cast<size_t>(ctx.rank)] = res.steps.back().loss;
      if (ctx.rank != 0) return;
      for (const StepMetrics& m : res.steps) {
        out.losses.push_back(m.loss);
        out.norms.push_back(m.grad_norm);
      }
      if (device) out.staged = device->copies();
    });
    return out;
  }

  static testing::TempCorpus* corpus_;
};
testing::TempCorpus* DeviceGroups::corpus_ = nullptr;

TEST_P(DeviceGroups, TrainLikeTheCpuBackendBitForBit) {
  const Case& c = GetParam();
  const Outcome want = train(c, false);
  const Outcome got = train(c, true);
  ASSERT_EQ(want.losses.size(), 6u);
  EXPECT_EQ(got.losses, want.losses);
  EXPECT_EQ(got.norms, want.norms);
  EXPECT_EQ(got.last, want.last);
  EXPECT_LT(want.losses.back(), want.losses.front()) << "the model learns";
  EXPECT_GT(got.staged, 0);
}

// Checkpoints of ranks on device memory: saved at step 3 of 6 by DP=2 x T=2 ranks at ZeRO-3
// (each rank's shard, its tensor slices), resumed by the same mesh on the strict backend and by
// DP=4 CPU ranks (resharded), continue with the CPU run's last three losses.
TEST_F(DeviceGroups, CheckpointsSaveAndResumeAcrossMeshes) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("zerod_device_groups_ckpt_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto job = [&](int world, const std::string& par, const std::string& ckpt) {
    return testing::tiny_job(*corpus_, world, 3, 2, 6, par,
                             R"(, "checkpoint_dir": ")" + ckpt + R"(", "save_interval": 3)", 8, "",
                             testing::tiny_llama());
  };
  auto run = [&](const JobConfig& cfg, int world, bool strict, const std::string& resume) {
    std::vector<double> losses(0);
    std::mutex mu;
    testing::run_world(world, [&](const RankContext& ctx) {
      TrainerOptions o = testing::quiet_trainer();
      if (strict) {
        o.backend = [&] { return std::make_unique<StrictDeviceBackend>(cfg.compute_dtype()); };
      }
      Trainer t(cfg, ctx, o);
      if (!resume.empty()) t.resume(resume);
      const TrainResult res = t.run();
      std::lock_guard<std::mutex> lock(mu);
      if (ctx.rank == 0)
        for (const StepMetrics& m : res.steps) losses.push_back(m.loss);
    });
    return losses;
  };
  const std::string tp = parallelism(R"("tensor": 2)");
  const std::vector<double> cpu = run(job(4, tp, (dir / "cpu").string()), 4, false, "");
  const std::vector<double> dev = run(job(4, tp, (dir / "dev").string()), 4, true, "");
  ASSERT_EQ(cpu.size(), 6u);
  EXPECT_EQ(dev, cpu);
  const std::vector<double> tail(cpu.begin() + 3, cpu.end());
  EXPECT_EQ(run(job(4, tp, (dir / "dev").string()), 4, true, "global_step3"), tail);
  const std::vector<double> resharded =
      run(job(4, "", (dir / "dev").string()), 4, false, "global_step3");
  ASSERT_EQ(resharded.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(resharded[i], tail[i], 1e-5 * tail[i]) << i;
  fs::remove_all(dir);
}

std::string parallelism(const std::string& members) {
  return R"(, "parallelism": {)" + members + "}";
}

constexpr const char* kOnebitAdam =
    R"({"type": "OneBitAdam", "params": {"lr": 2e-3, "betas": [0.9, 0.95], "weight_decay": 0.1,
        "freeze_step": 3}})";
constexpr const char* kOnebitLamb =
    R"({"type": "OneBitLamb", "params": {"lr": 0.05, "betas": [0.9, 0.95], "weight_decay": 0.1,
        "freeze_step": 3}})";
// Variance steps 1-2 (step 2 compressed), then local steps synchronised at steps 3, 5 and 7.
constexpr const char* kZeroOneAdam =
    R"({"type": "ZeroOneAdam", "params": {"lr": 2e-3, "betas": [0.9, 0.95], "weight_decay": 0.1,
        "var_freeze_step": 2, "var_update_scaler": 2, "local_step_scaler": 1,
        "local_step_clipper": 2}})";

// ZeroOneAdam saved between two synchronisations (step 4 of 8: local steps, each rank's weights
// and momentum its own, in host memory on GPU ranks) resumes on the strict backend with the
// uninterrupted CPU run's losses (the mean over both ranks: rank 1 going on from rank 0's weights
// would change them): the rank files restore the host states and the device weights follow.
TEST_F(DeviceGroups, ZeroOneAdamResumesBetweenSynchronisations) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("zerod_device_groups_01_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto run = [&](const std::string& ckpt, bool strict, const std::string& resume) {
    const JobConfig cfg = testing::tiny_job(
        *corpus_, 2, 0, 2, 8, "", R"(, "checkpoint_dir": ")" + ckpt + R"(", "save_interval": 4)", 8,
        "", testing::tiny_llama(), kZeroOneAdam);
    std::vector<double> losses;
    testing::run_world(2, [&](const RankContext& ctx) {
      TrainerOptions o = testing::quiet_trainer();
      if (strict) o.backend = [&] { return std::make_unique<StrictDeviceBackend>(DType::kF32); };
      Trainer t(cfg, ctx, o);
      if (!resume.empty()) t.resume(resume);
      const TrainResult res = t.run();
      if (ctx.rank == 0)
        for (const StepMetrics& m : res.steps) losses.push_back(m.loss);
    });
    return losses;
  };
  const std::vector<double> cpu = run((dir / "cpu").string(), false, "");
  ASSERT_EQ(cpu.size(), 8u);
  EXPECT_EQ(run((dir / "dev").string(), true, ""), cpu);
  const std::vector<double> tail(cpu.begin() + 4, cpu.end());
  EXPECT_EQ(run((dir / "dev").string(), true, "global_step4"), tail);
  // Without the rank files the ranks go on from rank 0's weights: other losses.
  for (int r = 0; r < 2; ++r)
    ASSERT_TRUE(
        fs::remove(dir / "dev" / "global_step4" / ("onebit_rank" + std::to_string(r) + ".bin")));
  EXPECT_NE(run((dir / "dev").string(), true, "global_step4"), tail);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Dimensions, DeviceGroups,
    ::testing::Values(
        Case{"data_zero1", 2, 1, "", testing::tiny_gpt2()},
        Case{"data_zero3_optimizer_on_host", 2, 3, "", testing::tiny_llama(), testing::kTinyAdamW,
             R"(, "offload_optimizer": {"device": "cpu"})"},
        Case{"tensor_sequence_parallel", 2, 1,
             parallelism(R"("tensor": 2, "sequence_parallel": true)"), testing::tiny_llama()},
        Case{"tensor_bf16", 2, 0, parallelism(R"("tensor": 2)"), testing::tiny_gpt2(),
             testing::kTinyAdamW, "", 2, true},
        Case{"context_ring", 2, 1, parallelism(R"("context": 2, "context_impl": "ring")"),
             testing::tiny_llama()},
        Case{"context_ulysses", 2, 0, parallelism(R"("context": 2)"), testing::tiny_gpt2()},
        Case{"pipeline_1f1b_tied", 2, 1, parallelism(R"("pipeline": 2)"),
             testing::tiny_gpt2_4layers(), testing::kTinyAdamW, "", 4},
        Case{"pipeline_zero_bubble", 2, 0,
             parallelism(R"("pipeline": 2, "pipeline_schedule": "zero_bubble")"),
             testing::tiny_llama_4layers(), testing::kTinyAdamW, "", 4},
        Case{"pipeline_interleaved", 2, 0,
             parallelism(R"("pipeline": 2, "pipeline_schedule": "interleaved_1f1b",
                            "virtual_stages": 2)"),
             testing::tiny_gpt2_4layers(), testing::kTinyAdamW, "", 4},
        Case{"pipeline_tensor_data", 8, 1, parallelism(R"("pipeline": 2, "tensor": 2)"),
             testing::tiny_llama_4layers(), testing::kTinyAdamW, "", 2},
        Case{"tensor_context", 4, 1,
             parallelism(R"("tensor": 2, "context": 2, "context_impl": "ring")"),
             testing::tiny_llama()},
        Case{"powersgd", 2, 0,
             R"(, "communication_compression": {"type": "powersgd", "rank": 2, "start_iter": 3})",
             testing::tiny_gpt2()},
        // Exchanges of host buffers over the host communicators (ZeroOptions::host_comm): Muon's
        // matrices at ZeRO-1 with the states on the host (and their tensor-parallel slices over
        // the tensor group's), and the 1-bit optimizers, whose
        // states and update a GPU rank keeps on the host (steps 4-6 compressed).
        Case{"muon_data", 2, 1, "", testing::tiny_gpt2(), testing::other_optimizers()[4].second,
             R"(, "offload_optimizer": {"device": "cpu"})"},
        Case{"muon_stage0", 2, 0, "", testing::tiny_gpt2(), testing::other_optimizers()[4].second},
        Case{"muon_tensor_data", 4, 1, parallelism(R"("tensor": 2)"), testing::tiny_llama(),
             testing::other_optimizers()[4].second, R"(, "offload_optimizer": {"device": "cpu"})"},
        Case{"onebit_adam", 2, 0, "", testing::tiny_gpt2(), kOnebitAdam},
        Case{"onebit_adam_bf16", 2, 0, "", testing::tiny_llama(), kOnebitAdam, "", 2, true},
        Case{"onebit_adam_fp16", 2, 0, R"(, "fp16": {"enabled": true, "initial_scale_power": 8})",
             testing::tiny_gpt2(), kOnebitAdam},
        Case{"onebit_lamb_pipeline_data", 4, 0, parallelism(R"("pipeline": 2)"),
             testing::tiny_gpt2_4layers(), kOnebitLamb, "", 4},
        Case{"zeroone_adam", 2, 0, "", testing::tiny_llama(), kZeroOneAdam}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace zerod::test
