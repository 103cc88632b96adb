// The training loop on a tiny byte-level job: the loss falls, runs are reproducible, gradient
// accumulation matches a larger micro-batch, reduced precision and loss scaling behave, and the
// CSV monitor writes what it should.
#include "engine/train/trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "core/rng.h"
#include "engine/config/parse.h"
#include "engine/data/corpus.h"
#include "engine/train/rank_device.h"

namespace zerod {
namespace {

namespace fs = std::filesystem;

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("zerod_trainer_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    // A learnable corpus: sentences drawn at random from a small set.
    const char* sentences[] = {
        "the cat sat on the mat. ", "a dog ran in the park. ", "we train small models on bytes. ",
        "zero shards the optimizer state. ", "loss goes down when it learns. "};
    Rng rng(1);
    std::string text;
    while (text.size() < 60000) text += sentences[rng.uniform(5)];
    write_text_shards({reinterpret_cast<const uint8_t*>(text.data()), text.size()}, dir_.string(),
                      0.1, 1 << 20, "tiny");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A job with the given extra top-level JSON members.
  JobConfig job(const std::string& extra, int micro = 8, int accum = 1, int steps = 50) {
    const std::string text = R"({
      "train_micro_batch_size_per_gpu": )" +
                             std::to_string(micro) + R"(,
      "gradient_accumulation_steps": )" +
                             std::to_string(accum) + R"(,
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "weight_decay": 0.01}},
      "gradient_clipping": 1.0,
      "model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 256, "seq_len": 32},
      "data": {"train": ")" + (dir_ / "tiny_train_*.bin").string() +
                             R"(",
               "val": ")" + (dir_ / "tiny_val_*.bin").string() +
                             R"(", "seed": 5},
      "train": {"steps": )" + std::to_string(steps) +
                             R"(, "seed": 3, "peak_flops": 1e11}
      )" + extra + "}";
    ParsedJob p = parse_job_text(text, "test job");
    resolve_job(p.config, 1);
    check_supported(p.config);
    return p.config;
  }

  static std::vector<double> losses(const TrainResult& r) {
    std::vector<double> l;
    for (const auto& s : r.steps) l.push_back(s.loss);
    return l;
  }

  fs::path dir_;
};

TrainerOptions quiet() {
  TrainerOptions o;
  o.log_steps = false;
  return o;
}

// train.device "cuda" where it cannot run (no GPU, or a build without CUDA) is a clear input error
// (exit 2), raised before anything is trained.
TEST_F(TrainerTest, CudaWithoutAGpuIsAnInputErrorNamingTheKey) {
  if (visible_gpus() > 0) GTEST_SKIP() << "this machine has a GPU";
  JobConfig cfg = job("", 8, 1, 2);
  cfg.train.device = TrainDevice::kCuda;
  try {
    Trainer t(cfg, quiet());
    FAIL() << "a CUDA job started without a GPU";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("train.device: \"cuda\""), std::string::npos) << what;
    EXPECT_TRUE(what.find("no GPU") != std::string::npos ||
                what.find("without CUDA") != std::string::npos)
        << what;
  }
}

// A CPU job of a CUDA-enabled build does not load cuBLASLt (kernels/cuda/cublaslt_library.h
// loads it at the first GPU matmul): its ~160 MiB of resident pages stay out of CPU runs.
TEST_F(TrainerTest, CpuRunsDoNotLoadTheGpuMatmulLibrary) {
  Trainer t(job("", 8, 1, 2), quiet());
  EXPECT_EQ(t.run().steps.size(), 2u);
  std::ifstream maps("/proc/self/maps");
  ASSERT_TRUE(maps.good());
  std::string line;
  int lines = 0;
  while (std::getline(maps, line)) {
    ++lines;
    EXPECT_EQ(line.find("libcublasLt"), std::string::npos) << line;
  }
  EXPECT_GT(lines, 10);
}

TEST_F(TrainerTest, LossFallsWellBelowTheStartWithin50Steps) {
  Trainer t(job(""), quiet());
  const TrainResult r = t.run();
  ASSERT_EQ(r.steps.size(), 50u);
  EXPECT_NEAR(r.steps.front().loss, std::log(256.0), 0.3);  // an untrained byte model
  EXPECT_LT(r.steps.back().loss, 0.5 * r.steps.front().loss);
  for (const auto& s : r.steps) {
    EXPECT_TRUE(std::isfinite(s.loss));
    EXPECT_FALSE(s.skipped);
    EXPECT_GT(s.tokens_per_s, 0);
  }
}

TEST_F(TrainerTest, TwoRunsGiveBitIdenticalLosses) {
  Trainer a(job("", 8, 1, 12), quiet()), b(job("", 8, 1, 12), quiet());
  EXPECT_EQ(losses(a.run()), losses(b.run()));
  JobConfig other = job("", 8, 1, 12);
  other.train.seed = 4;  // a different initialisation changes the curve
  Trainer c(other, quiet());
  Trainer d(job("", 8, 1, 12), quiet());
  EXPECT_NE(losses(c.run()), losses(d.run()));
}

TEST_F(TrainerTest, GradientAccumulationMatchesOneLargeMicroBatch) {
  Trainer whole(job("", 8, 1, 10), quiet()), halves(job("", 4, 2, 10), quiet()),
      quarters(job("", 2, 4, 10), quiet());
  const auto a = losses(whole.run()), b = losses(halves.run()), c = losses(quarters.run());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(b[i], a[i], 1e-5 * a[i]) << "step " << i + 1;
    EXPECT_NEAR(c[i], a[i], 1e-5 * a[i]) << "step " << i + 1;
  }
}

TEST_F(TrainerTest, Bf16TracksFp32) {
  Trainer f32(job("", 8, 1, 30), quiet()),
      bf16(job(R"(, "bf16": {"enabled": true})", 8, 1, 30), quiet());
  const auto a = losses(f32.run()), b = losses(bf16.run());
  EXPECT_NE(a, b);
  // bf16 keeps ~3 significant digits in weights and activations; over 30 steps the curves stay
  // within a few percent of each other.
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 0.05 * a[i]) << "step " << i + 1;
}

TEST_F(TrainerTest, Fp16DynamicLossScaleSkipsOverflowingStepsAndBacksOff) {
  // 2^40 overflows fp16 activation gradients at once: steps are skipped and the scale halves
  // (hysteresis 1) until gradients fit, then training proceeds.
  JobConfig cfg = job(R"(, "fp16": {"enabled": true, "initial_scale_power": 40, "hysteresis": 1,
                                    "loss_scale_window": 1000})",
                      8, 1, 40);
  Trainer t(cfg, quiet());
  const TrainResult r = t.run();
  ASSERT_GT(r.skipped_steps, 0);
  double scale = std::ldexp(1.0, 40);
  for (const auto& s : r.steps) {
    EXPECT_EQ(s.loss_scale, scale) << "step " << s.step;
    if (s.skipped) scale /= 2;
  }
  EXPECT_LT(r.steps.back().loss, r.steps.front().loss);
  int64_t skipped = 0;
  for (const auto& s : r.steps) skipped += s.skipped;
  EXPECT_EQ(skipped, r.skipped_steps);
}

TEST_F(TrainerTest, ValidationAndCsvMonitor) {
  const std::string out = (dir_ / "runs").string();
  JobConfig cfg = job(
      R"(, "csv_monitor": {"enabled": true, "output_path": ")" + out + R"(", "job_name": "tiny"})",
      8, 1, 6);
  cfg.train.eval_interval = 3;
  cfg.train.eval_batches = 2;
  Trainer t(cfg, quiet());
  const TrainResult r = t.run();
  ASSERT_TRUE(r.steps[2].val_loss.has_value());
  ASSERT_TRUE(r.steps[5].val_loss.has_value());
  EXPECT_FALSE(r.steps[3].val_loss.has_value());
  EXPECT_NEAR(*r.steps[2].val_loss, *t.evaluate(), 0.5);  // same weights after step 6: close
  std::ifstream in(dir_ / "runs" / "tiny" / "metrics.csv");
  ASSERT_TRUE(in.good());
  std::string header;
  std::getline(in, header);
  EXPECT_EQ(header.rfind("step,loss,lr,grad_norm,loss_scale,tokens_per_s", 0), 0u) << header;
  std::string line;
  int rows = 0;
  while (std::getline(in, line)) {
    ++rows;
    std::stringstream ss(line);
    std::string step, loss;
    std::getline(ss, step, ',');
    std::getline(ss, loss, ',');
    EXPECT_EQ(std::stoi(step), rows);
    // 9 significant digits: the printed loss parses back to the double within 1e-8 relative.
    EXPECT_NEAR(std::stod(loss), r.steps[static_cast<size_t>(rows - 1)].loss,
                1e-8 * std::stod(loss));
  }
  EXPECT_EQ(rows, 6);
}

}  // namespace
}  // namespace zerod
