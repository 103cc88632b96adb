// The trainer on GPUs (train.device "cuda"): the whole model on a GPU against the CPU backend,
// bf16 against fp32, ZeRO stages 0-3 and offload on one GPU, resume, and several GPUs over NCCL.
// Every test skips when this process sees no GPU (or fewer than it needs).
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "engine/train/rank_device.h"
#include "tests/unit/engine/train/train_test_util.h"

namespace zerod {
namespace {

using testing::TempCorpus;
using testing::tiny_job;

#define ZD_NEED_GPUS(n)                                                      \
  do {                                                                       \
    if (visible_gpus() < (n))                                                \
      GTEST_SKIP() << "needs " << (n) << " GPU(s), sees " << visible_gpus(); \
  } while (0)

constexpr const char* kCuda = R"(, "device": "cuda")";

std::vector<double> losses_of(const JobConfig& cfg) {
  Trainer t(cfg, testing::quiet_trainer());
  std::vector<double> out;
  for (const StepMetrics& m : t.run().steps) out.push_back(m.loss);
  return out;
}

// Relative difference of two loss curves, step by step (the largest).
double max_rel(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    EXPECT_TRUE(std::isfinite(a[i]) && std::isfinite(b[i])) << "step " << i + 1;
    worst = std::max(worst, std::abs(a[i] - b[i]) / std::abs(b[i]));
  }
  return worst;
}

// The model on a GPU in fp32 follows the CPU reference: losses over 10 steps within 1e-4.
TEST(TrainerCuda, Fp32LossesMatchTheCpuBackend) {
  ZD_NEED_GPUS(1);
  TempCorpus corpus("zerod_cuda_fp32");
  const std::vector<double> cpu = losses_of(tiny_job(corpus, 1, 0, 2, 10));
  const std::vector<double> gpu = losses_of(tiny_job(corpus, 1, 0, 2, 10, "", kCuda));
  EXPECT_LT(max_rel(gpu, cpu), 1e-4);
  EXPECT_LT(gpu.back(), gpu.front()) << "the model learns";
}

// SGD, Adagrad and Lion on a GPU (kernels/cuda/optim.cu) follow the CPU in fp32, also with the
// optimizer offloaded to the host at stage 3; Muon (its step on the host) offloaded only.
TEST(TrainerCuda, SgdAdagradLionMatchTheCpuBackend) {
  ZD_NEED_GPUS(1);
  TempCorpus corpus("zerod_cuda_optim");
  const std::string offload = R"(, "offload_optimizer": {"device": "cpu"})";
  for (const auto& [name, optimizer] : testing::other_optimizers()) {
    const std::vector<double> cpu =
        losses_of(tiny_job(corpus, 1, 0, 2, 10, "", "", 8, "", testing::tiny_gpt2(), optimizer));
    const std::vector<double> gpu_off = losses_of(
        tiny_job(corpus, 1, 3, 2, 10, "", kCuda, 8, offload, testing::tiny_gpt2(), optimizer));
    EXPECT_LT(max_rel(gpu_off, cpu), 1e-4) << name << " offload";
    EXPECT_LT(gpu_off.back(), gpu_off.front()) << name << ": the model learns";
    if (name == "Muon") continue;  // (on a GPU only with the optimizer states on the host)
    const std::vector<double> gpu =
        losses_of(tiny_job(corpus, 1, 0, 2, 10, "", kCuda, 8, "", testing::tiny_gpt2(), optimizer));
    EXPECT_LT(max_rel(gpu, cpu), 1e-4) << name;
  }
}

// bf16 on a GPU tracks the fp32 curve: every step within 2% (bf16 keeps 8 bits of mantissa;
// the fp32 master weights keep the updates exact).
TEST(TrainerCuda, Bf16TracksTheFp32LossCurve) {
  ZD_NEED_GPUS(1);
  TempCorpus corpus("zerod_cuda_bf16");
  const std::vector<double> fp32 = losses_of(tiny_job(corpus, 1, 0, 1, 20, "", kCuda));
  const std::vector<double> bf16 =
      losses_of(tiny_job(corpus, 1, 0, 1, 20, R"(, "bf16": {"enabled": true})", kCuda));
  EXPECT_LT(max_rel(bf16, fp32), 2e-2);
  EXPECT_LT(bf16.back(), bf16.front() * 0.9);
}

// fp16 with the dynamic loss scaler trains on a GPU too.
TEST(TrainerCuda, Fp16WithTheLossScalerLearns) {
  ZD_NEED_GPUS(1);
  TempCorpus corpus("zerod_cuda_fp16");
  const std::vector<double> fp16 = losses_of(tiny_job(
      corpus, 1, 0, 1, 20, R"(, "fp16": {"enabled": true, "initial_scale_power": 8})", kCuda));
  for (double l : fp16) EXPECT_TRUE(std::isfinite(l));
  EXPECT_LT(fp16.back(), fp16.front() * 0.9);
}

// ZeRO stages 0-3 and every offload setting on one GPU give stage 0's losses.
TEST(TrainerCuda, ZeroStagesAndOffloadOnOneGpuMatchStageZero) {
  ZD_NEED_GPUS(1);
  TempCorpus corpus("zerod_cuda_stages");
  const std::string nvme = corpus.dir().string();
  for (const char* dtype : {"", R"(, "bf16": {"enabled": true})"}) {
    const std::vector<double> base = losses_of(tiny_job(corpus, 1, 0, 2, 8, dtype, kCuda));
    struct Case {
      int stage;
      std::string zero;
    };
    const std::vector<Case> cases = {
        {1, ""},
        {2, ""},
        {3, ""},
        {2, R"(, "offload_optimizer": {"device": "cpu", "pin_memory": true})"},
        {3, R"(, "offload_optimizer": {"device": "nvme", "nvme_path": ")" + nvme + R"("})"},
        {3, R"(, "offload_param": {"device": "cpu"})"},
        {3, R"(, "offload_param": {"device": "nvme", "nvme_path": ")" + nvme +
                R"(", "max_in_cpu": 1000})"},
    };
    for (const Case& c : cases) {
      SCOPED_TRACE(fmt::format("stage {}{} {}", c.stage, c.zero, dtype));
      const std::vector<double> got =
          losses_of(tiny_job(corpus, 1, c.stage, 2, 8, dtype, kCuda, 8, c.zero));
      // fp32: the same arithmetic up to summation order. bf16: accumulating micro-batches in a
      // shard (stages 2-3) rounds each sum once more than accumulating in place (stages 0-1), a
      // bf16 ulp (2^-8) here and there; as the CPU parity tests, 1e-2 over the curve.
      EXPECT_LT(max_rel(got, base), dtype[0] ? 1e-2 : 1e-5);
    }
  }
}

// N steps, a checkpoint, then M more after a resume equal N + M steps in one run.
TEST(TrainerCuda, ResumeContinuesTheRun) {
  ZD_NEED_GPUS(1);
  TempCorpus corpus("zerod_cuda_resume");
  const std::string ckpt = (corpus.dir() / "ckpt").string();
  const std::string save = R"(, "checkpoint_dir": ")" + ckpt + R"(", "save_interval": 4)";
  const std::string bf16 = R"(, "bf16": {"enabled": true})";
  const std::vector<double> whole =
      losses_of(tiny_job(corpus, 1, 2, 1, 8, bf16, std::string(kCuda)));
  {
    JobConfig first = tiny_job(corpus, 1, 2, 1, 4, bf16, std::string(kCuda) + save);
    losses_of(first);
  }
  JobConfig second = tiny_job(corpus, 1, 2, 1, 8, bf16, std::string(kCuda) + save);
  Trainer t(second, testing::quiet_trainer());
  t.resume("latest");
  std::vector<double> rest;
  for (const StepMetrics& m : t.run().steps) rest.push_back(m.loss);
  ASSERT_EQ(rest.size(), 4u);
  EXPECT_LT(max_rel(rest, std::vector<double>(whole.begin() + 4, whole.end())), 1e-6);
}

// Several GPUs over NCCL (ranks as threads, one GPU each) give one GPU's losses at every stage.
TEST(TrainerCuda, NcclRanksMatchOneGpuAtEveryStage) {
  ZD_NEED_GPUS(2);
  TempCorpus corpus("zerod_cuda_nccl");
  const int world = std::min(visible_gpus(), 4);
  for (const char* dtype : {"", R"(, "bf16": {"enabled": true})"}) {
    const std::vector<double> one = losses_of(tiny_job(corpus, 1, 0, 1, 8, dtype, kCuda));
    for (int stage = 0; stage <= 3; ++stage) {
      SCOPED_TRACE(fmt::format("world {} stage {} {}", world, stage, dtype));
      const JobConfig cfg = tiny_job(corpus, world, stage, 1, 8, dtype, kCuda);
      std::vector<double> losses;
      std::mutex mu;
      testing::run_world(world, [&](const RankContext& ctx) {
        Trainer t(cfg, ctx, testing::quiet_trainer());
        const TrainResult r = t.run();
        std::lock_guard<std::mutex> lock(mu);
        if (ctx.rank == 0)
          for (const StepMetrics& m : r.steps) losses.push_back(m.loss);
      });
      EXPECT_LT(max_rel(losses, one), dtype[0] ? 2e-2 : 1e-4);
    }
  }
}

// Ranks sharing one GPU (train.device_comm gloo: every process group moves device tensors
// through host memory over Gloo, comm/staged/) give the CPU ranks' losses with data, tensor,
// context and pipeline parallelism, Muon and OneBitAdam: the GPU paths of the parallel layers and
// of the host-buffer exchanges that the strict device
// backend checks on the CPU (DeviceGroups), here on a real device and its streams.
TEST(TrainerCuda, RanksSharingOneGpuOverStagedGlooMatchCpuRanks) {
  ZD_NEED_GPUS(1);
  TempCorpus corpus("zerod_cuda_staged");
  struct Case {
    const char* name;
    std::string par;
    testing::TinyModel model;
    int stage, accum;
    std::string optimizer = testing::kTinyAdamW;
    std::string zero_extra;
  };
  const Case cases[] = {
      // The host-buffer exchanges over the host communicator (ZeroOptions::host_comm): Muon's
      // matrices, the 1-bit optimizers' compressed momenta (states and update on the host).
      {"muon", "", testing::tiny_gpt2(), 1, 2, testing::other_optimizers()[4].second,
       R"(, "offload_optimizer": {"device": "cpu"})"},
      {"onebit_adam", "", testing::tiny_gpt2(), 0, 2,
       R"({"type": "OneBitAdam", "params": {"lr": 2e-3, "freeze_step": 3}})"},
      {"data", "", testing::tiny_gpt2(), 1, 2},
      {"tensor", R"(, "parallelism": {"tensor": 2, "sequence_parallel": true})",
       testing::tiny_llama(), 1, 2},
      {"context", R"(, "parallelism": {"context": 2, "context_impl": "ring"})",
       testing::tiny_llama(), 0, 2},
      {"pipeline", R"(, "parallelism": {"pipeline": 2})", testing::tiny_gpt2_4layers(), 1, 4},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto losses = [&](const std::string& train) {
      const JobConfig cfg = tiny_job(corpus, 2, c.stage, c.accum, 8, c.par, train, 8, c.zero_extra,
                                     c.model, c.optimizer);
      std::vector<double> out;
      std::mutex mu;
      testing::run_world(2, [&](const RankContext& ctx) {
        Trainer t(cfg, ctx, testing::quiet_trainer());
        const TrainResult r = t.run();
        std::lock_guard<std::mutex> lock(mu);
        if (ctx.rank == 0)
          for (const StepMetrics& m : r.steps) out.push_back(m.loss);
      });
      return out;
    };
    const std::vector<double> cpu = losses("");
    const std::vector<double> gpu = losses(R"(, "device": "cuda", "device_comm": "gloo")");
    EXPECT_LT(max_rel(gpu, cpu), 1e-4);
    EXPECT_LT(gpu.back(), gpu.front()) << "the model learns";
  }
}

}  // namespace
}  // namespace zerod
