// Checkpoints end to end on ranks as threads: round trips of every stage and world size, exact
// (bitwise) resume, resharding to other world sizes and stages, async saves, retention, and
// torn or corrupt checkpoints.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <numeric>
#include <set>

#include "engine/checkpoint/checkpoint_dir.h"
#include "engine/checkpoint/export.h"
#include "engine/checkpoint/hf_model.h"
#include "engine/checkpoint/shard_io.h"
#include "engine/config/model_spec.h"
#include "train_test_util.h"

namespace zerod {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::quiet_trainer;
using testing::run_world;
using testing::TempCorpus;
using testing::tiny_job;
using testing::TinyModel;

class Checkpoints : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { corpus_ = new TempCorpus("zerod_ckpt_corpus"); }
  static void TearDownTestSuite() { delete corpus_; }
  void SetUp() override {
    // Parametrized tests are named "Test/Param": one directory, not a nested one.
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(name.begin(), name.end(), '/', '_');
    ckpt_ = fs::temp_directory_path() / ("zerod_ckpt_" + std::to_string(::getpid()) + "_" + name);
    fs::remove_all(ckpt_);
  }
  void TearDown() override { fs::remove_all(ckpt_); }

  std::string train_extra(int save_interval, const std::string& more = "") const {
    return R"(, "checkpoint_dir": ")" + ckpt_.string() + R"(", "save_interval": )" +
           std::to_string(save_interval) + more;
  }

  struct RunSpec {
    int world = 1, stage = 0, accum = 1, steps = 10, save_interval = 0;
    std::string extra = "";       // top-level JSON members
    std::string resume = "";      // "", "latest" or a tag
    std::string train_more = "";  // more train members
    TinyModel model = testing::tiny_gpt2();
    std::string optimizer = testing::kTinyAdamW;
    std::string zero_extra = "";  // more zero_optimization members
  };
  // Losses of the steps this run trained (rank 0's, identical on every rank).
  std::vector<double> run(const RunSpec& r) {
    const JobConfig cfg =
        tiny_job(*corpus_, r.world, r.stage, r.accum, r.steps, r.extra,
                 train_extra(r.save_interval, r.train_more), 8, r.zero_extra, r.model, r.optimizer);
    std::vector<double> losses;
    std::mutex mu;
    run_world(r.world, [&](const RankContext& ctx) {
      Trainer t(cfg, ctx, quiet_trainer());
      if (!r.resume.empty()) t.resume(r.resume);
      const TrainResult res = t.run();
      if (ctx.rank != 0) return;
      std::lock_guard<std::mutex> lock(mu);
      for (const auto& s : res.steps) losses.push_back(s.loss);
    });
    return losses;
  }

  // `optimizer` trained 8 steps at world 2, saved at step 4 and resumed there: the last 4 losses
  // bitwise equal, at stages 0 and 3 and at stage 3 offloaded to the CPU; the manifest records
  // the type. Leaves the offloaded run's checkpoint.
  void expect_bitwise_resume(const TinyModel& model, const std::string& optimizer,
                             const std::string& name) {
    for (int stage : {0, 3, -3}) {  // -3: stage 3 with the optimizer offloaded
      fs::remove_all(ckpt_);
      RunSpec r{.world = 2, .stage = std::abs(stage), .accum = 2, .steps = 8, .save_interval = 4};
      r.model = model;
      r.optimizer = optimizer;
      if (stage < 0) r.zero_extra = kCpuOffload;
      const std::vector<double> whole = run(r);
      ASSERT_EQ(whole.size(), 8u);
      r.save_interval = 0;
      r.resume = "global_step4";
      const std::vector<double> rest = run(r);
      ASSERT_EQ(rest.size(), 4u);
      for (size_t i = 0; i < 4; ++i) {
        EXPECT_EQ(rest[i], whole[4 + i]) << name << " stage " << stage << " step " << 5 + i;
      }
      const Manifest m = read_manifest((ckpt_ / "global_step4").string());
      EXPECT_EQ(m.job["optimizer"]["type"], nlohmann::json::parse(optimizer)["type"]) << name;
    }
  }
  static constexpr const char* kCpuOffload = R"(, "offload_optimizer": {"device": "cpu"})";

  static TempCorpus* corpus_;
  fs::path ckpt_;
};

TempCorpus* Checkpoints::corpus_ = nullptr;

// The tests that hold for every architecture: GPT-2 and a Llama (grouped-query attention, untied
// output head).
class ModelCheckpoints : public Checkpoints, public ::testing::WithParamInterface<TinyModel> {};

TEST_F(Checkpoints, RoundTripOfEveryStageWorldSizeAndDtype) {
  for (const std::string dtype : {"", R"(, "bf16": {"enabled": true})"}) {
    for (int world : {1, 2, 4}) {
      for (int stage : {0, 1, 2, 3}) {
        fs::remove_all(ckpt_);
        const JobConfig cfg = tiny_job(*corpus_, world, stage, 1, 3, dtype, train_extra(0));
        std::vector<std::vector<float>> saved(static_cast<size_t>(world)), loaded(saved.size());
        auto states = [](ZeroEngine& e) {
          std::vector<float> all;
          for (int u = 0; u < e.partition().num_units(); ++u) {
            const int64_t n = e.partition().unit(u).shard;
            for (float* p : {e.master(u), e.exp_avg(u), e.exp_avg_sq(u)})
              all.insert(all.end(), p, p + n);
          }
          return all;
        };
        TrainingProgress before;
        run_world(world, [&](const RankContext& ctx) {
          Trainer t(cfg, ctx, quiet_trainer());
          t.run();
          t.save_checkpoint("rt");
          saved[static_cast<size_t>(ctx.rank)] = states(t.engine());
          if (ctx.rank == 0) before = t.progress();
        });
        TrainingProgress after;
        run_world(world, [&](const RankContext& ctx) {
          Trainer t(cfg, ctx, quiet_trainer());
          t.resume("rt");
          loaded[static_cast<size_t>(ctx.rank)] = states(t.engine());
          if (ctx.rank == 0) after = t.progress();
        });
        const std::string what = "world " + std::to_string(world) + " stage " +
                                 std::to_string(stage) + (dtype.empty() ? " fp32" : " bf16");
        EXPECT_EQ(saved, loaded) << what;
        EXPECT_EQ(after.global_step, 3) << what;
        EXPECT_EQ(after.adam_steps, before.adam_steps) << what;
        EXPECT_EQ(after.samples_seen, before.samples_seen) << what;
        const Manifest m = read_manifest((ckpt_ / "rt").string());
        EXPECT_EQ(m.world_size, world) << what;
        EXPECT_EQ(m.zero_stage, stage) << what;
        // Stage 0 ranks hold identical states: rank 0 alone writes them.
        EXPECT_EQ(m.files.size(), stage == 0 ? 1u : static_cast<size_t>(world)) << what;
      }
    }
  }
}

TEST_P(ModelCheckpoints, ResumeIsBitwiseExactForEveryStageWithAccumulationFp32AndBf16) {
  for (const std::string dtype : {"", R"(, "bf16": {"enabled": true})"}) {
    for (int stage : {0, 1, 2, 3}) {
      fs::remove_all(ckpt_);
      const std::vector<double> whole = run({.world = 2,
                                             .stage = stage,
                                             .accum = 2,
                                             .steps = 10,
                                             .save_interval = 5,
                                             .extra = dtype,
                                             .model = GetParam()});
      ASSERT_EQ(whole.size(), 10u);
      // Stop after step 5 (its checkpoint is what the uninterrupted run saved), resume, finish.
      const std::vector<double> rest = run({.world = 2,
                                            .stage = stage,
                                            .accum = 2,
                                            .steps = 10,
                                            .extra = dtype,
                                            .resume = "global_step5",
                                            .model = GetParam()});
      ASSERT_EQ(rest.size(), 5u);
      for (size_t i = 0; i < 5; ++i) {
        EXPECT_EQ(rest[i], whole[5 + i])
            << "stage " << stage << (dtype.empty() ? " fp32" : " bf16") << " step " << 6 + i;
      }
    }
  }
}

// SGD (Nesterov; dampening), Adagrad, Lion and Muon: their states (the momentum buffer in m,
// Adagrad's sum in v, Lion's average in m; Muon's momentum in m, its AdamW's moments) resume
// bitwise exactly at stages 0 and 3 and with the optimizer offloaded; the first step's special case
// (SGD's buffer, Adagrad's initial sum) is not redone.
TEST_P(ModelCheckpoints, SgdAdagradLionResumeBitwiseExactly) {
  for (const auto& [name, optimizer] : testing::other_optimizers())
    expect_bitwise_resume(GetParam(), optimizer, name);
}

// Lamb: exp_avg and exp_avg_sq resume bitwise exactly at stages 0 and 3 and with the optimizer
// offloaded (the trust ratios are recomputed from them and the weights every step), and the
// manifest records the type.
TEST_P(ModelCheckpoints, LambResumesBitwiseExactly) {
  expect_bitwise_resume(GetParam(), testing::kTinyLamb, "Lamb");
  const Manifest m = read_manifest((ckpt_ / "global_step4").string());
  EXPECT_EQ(m.job["optimizer"]["params"]["min_coeff"], 0.001);
  // Adam's moments are not Lamb's (no trust ratio): resuming with AdamW is refused.
  RunSpec adam{.world = 2, .stage = 3, .accum = 2, .steps = 8, .resume = "global_step4"};
  adam.model = GetParam();
  adam.zero_extra = kCpuOffload;
  EXPECT_THROW(run(adam), InputError);
}

// A checkpoint records its optimizer (the manifest's job); resuming with another type is refused
// (exit 2), naming both; Adam and AdamW share their states and may follow each other.
TEST_F(Checkpoints, ResumingWithAnotherOptimizerTypeIsRefused) {
  const auto others = testing::other_optimizers();
  const std::string sgd = others[0].second, lion = others[3].second;
  ASSERT_EQ(run({.steps = 2, .save_interval = 2, .optimizer = sgd}).size(), 2u);
  for (const std::string& other : {lion, std::string(testing::kTinyAdamW), others[2].second}) {
    try {
      run({.steps = 4, .resume = "global_step2", .optimizer = other});
      ADD_FAILURE() << "resumed an SGD checkpoint with " << other;
    } catch (const InputError& e) {
      EXPECT_EQ(e.exit_code(), 2);
      const std::string type = json::parse(other)["type"];
      EXPECT_NE(
          std::string(e.what()).find("saved by optimizer SGD; this job's optimizer is " + type),
          std::string::npos)
          << e.what();
    }
  }
  // The same type with other hyperparameters resumes.
  EXPECT_EQ(run({.steps = 4, .resume = "global_step2", .optimizer = others[1].second}).size(), 2u);
  // Adam after AdamW.
  fs::remove_all(ckpt_);
  ASSERT_EQ(run({.steps = 2, .save_interval = 2}).size(), 2u);
  EXPECT_EQ(run({.steps = 4,
                 .resume = "global_step2",
                 .optimizer = R"({"type": "Adam", "params": {"lr": 2e-3}})"})
                .size(),
            2u);
}

TEST_P(ModelCheckpoints, ReshardingToOtherWorldSizesAndStagesContinuesTheLossCurve) {
  struct Case {
    int from_world, from_stage, to_world, to_stage;
  };
  for (const Case c : {Case{4, 3, 2, 2}, Case{2, 1, 4, 3}, Case{2, 3, 1, 2}}) {
    fs::remove_all(ckpt_);
    run({.world = c.from_world,
         .stage = c.from_stage,
         .steps = 5,
         .save_interval = 5,
         .model = GetParam()});
    const std::vector<double> resumed = run({.world = c.to_world,
                                             .stage = c.to_stage,
                                             .steps = 10,
                                             .resume = "latest",
                                             .model = GetParam()});
    fs::remove_all(ckpt_);
    const std::vector<double> uninterrupted =
        run({.world = c.to_world, .stage = c.to_stage, .steps = 10, .model = GetParam()});
    ASSERT_EQ(resumed.size(), 5u);
    for (size_t i = 0; i < 5; ++i) {
      EXPECT_NEAR(resumed[i], uninterrupted[5 + i], 1e-6 * uninterrupted[5 + i])
          << c.from_world << "x stage " << c.from_stage << " -> " << c.to_world << "x stage "
          << c.to_stage << ", step " << 6 + i;
    }
  }
}

// Resuming on another world size with the same global batch is bitwise exact where the sums are
// the same sums: at stage 0 one rank accumulating 2 micro-batches adds the same two gradients as
// 2 ranks' all-reduce does (scaled by powers of two), and every rank computes the gradient norm
// over the whole gradient. World 2 saves, world 1 (2 micro-batches) resumes, and the reverse.
TEST_P(ModelCheckpoints, ResumeOnAnotherWorldSizeIsBitwiseExactAtStage0) {
  struct Case {
    int from_world, from_accum, to_world, to_accum;
  };
  for (const Case c : {Case{2, 1, 1, 2}, Case{1, 2, 2, 1}}) {
    fs::remove_all(ckpt_);
    const std::vector<double> whole = run({.world = c.from_world,
                                           .accum = c.from_accum,
                                           .steps = 8,
                                           .save_interval = 4,
                                           .model = GetParam()});
    ASSERT_EQ(whole.size(), 8u);
    const std::vector<double> rest = run({.world = c.to_world,
                                          .accum = c.to_accum,
                                          .steps = 8,
                                          .resume = "global_step4",
                                          .model = GetParam()});
    ASSERT_EQ(rest.size(), 4u);
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(rest[i], whole[4 + i])
          << "world " << c.from_world << " -> " << c.to_world << ", step " << 5 + i;
    }
  }
}

// The global batch a checkpoint was trained with (the manifest's resolved job) is kept on resume:
// a job that gives train_batch_size keeps it on another world size (gradient_accumulation_steps
// follows); one that gives only the micro-batch would change it with the world size, which is
// refused (exit 2) with the numbers and the fix, unless train.allow_batch_change. The triangle
// before and after is logged.
TEST_F(Checkpoints, ResumeOnAnotherWorldSizeKeepsTheGlobalBatchOrRefusesTheChange) {
  // global: train_batch_size (nullopt: derived from the micro-batch 4 and the world size).
  auto job = [&](int world, std::optional<int64_t> global, const std::string& more = "") {
    JobConfig cfg = tiny_job(*corpus_, 1, 0, 1, 4, "", train_extra(2, more));
    cfg.train_batch_size = global;
    cfg.train_micro_batch_size_per_gpu = 4;
    cfg.gradient_accumulation_steps.reset();
    resolve_job(cfg, world);
    return cfg;
  };
  auto train = [&](const JobConfig& cfg, const std::string& resume) {
    std::vector<double> losses;
    std::mutex mu;
    run_world(cfg.world_size, [&](const RankContext& ctx) {
      Trainer t(cfg, ctx, quiet_trainer());
      if (!resume.empty()) t.resume(resume);
      const TrainResult r = t.run();
      std::lock_guard<std::mutex> lock(mu);
      if (ctx.rank == 0)
        for (const auto& s : r.steps) losses.push_back(s.loss);
    });
    return losses;
  };
  auto refusal = [&](const JobConfig& cfg) {
    try {
      train(cfg, "global_step2");
    } catch (const InputError& e) {
      EXPECT_EQ(e.exit_code(), 2);
      return std::string(e.what());
    }
    ADD_FAILURE() << "resumed with another global batch";
    return std::string();
  };
  const std::vector<double> whole = train(job(2, std::nullopt), "");  // 8 = 4 x 1 x 2
  ASSERT_EQ(whole.size(), 4u);
  const std::string saved =
      "was trained with a global batch of 8 sequences/step = micro-batch 4 x accumulation 1 x "
      "data-parallel 2";

  // Micro-batch only, on 1 rank: 4 sequences a step. Refused; 8 divides by 4 x 1.
  std::string e = refusal(job(1, std::nullopt));
  EXPECT_EQ(e.rfind("train_batch_size: " + (ckpt_ / "global_step2").string(), 0), 0u) << e;
  EXPECT_NE(e.find(saved), std::string::npos) << e;
  EXPECT_NE(e.find("this job's is 4 sequences/step = micro-batch 4 x accumulation 1 x "
                   "data-parallel 1"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("set train_batch_size 8 (gradient_accumulation_steps then follows: 8 / "
                   "(train_micro_batch_size_per_gpu 4 x data-parallel size 1) = 2)"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("train.allow_batch_change: true"), std::string::npos) << e;
  // On 4 ranks: 16 a step, and 8 is not divisible by 4 x 4.
  e = refusal(job(4, std::nullopt));
  EXPECT_NE(e.find("train_batch_size 8 is not divisible by train_micro_batch_size_per_gpu 4 x "
                   "data-parallel size 4 = 16"),
            std::string::npos)
      << e;
  EXPECT_EQ(read_latest(ckpt_.string()).value_or(""), "global_step4");  // nothing was saved

  // train_batch_size 8 on 1 rank: accumulation 2 keeps the batch, and the loss curve goes on.
  {
    testing::CapturedLog log;
    const std::vector<double> rest = train(job(1, 8), "global_step2");
    ASSERT_EQ(rest.size(), 2u);
    EXPECT_NEAR(rest[0], whole[2], 1e-6 * whole[2]);
    EXPECT_NEAR(rest[1], whole[3], 1e-6 * whole[3]);
    EXPECT_NE(log.text().find("batch on resume: the checkpoint trained 8 sequences/step = "
                              "micro-batch 4 x accumulation 1 x data-parallel 2; this run trains 8 "
                              "sequences/step = micro-batch 4 x accumulation 2 x data-parallel 1"),
              std::string::npos)
        << log.text();
  }
  // Allowed: 4 sequences a step from step 3 on, with a warning.
  {
    testing::CapturedLog log;
    const std::vector<double> rest =
        train(job(1, std::nullopt, R"(, "allow_batch_change": true)"), "global_step2");
    EXPECT_EQ(rest.size(), 2u);
    EXPECT_NE(log.text().find("this run trains 4 sequences/step = micro-batch 4 x accumulation 1 x "
                              "data-parallel 1 (another global batch: train.allow_batch_change)"),
              std::string::npos)
        << log.text();
  }
}

// metrics.csv lines of `dir` (header first), "" entries never.
std::vector<std::string> csv_lines(const fs::path& file) {
  std::ifstream in(file);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  return lines;
}

// Runs never destroy each other's metrics. A fresh run of a job whose csv_monitor / tensorboard
// directory holds an earlier run's takes OUTPUT_PATH/JOB_NAME_1, _2, ...; a run resumed from a
// checkpoint appends to the directory that checkpoint's run wrote (the manifest records it), with
// one row per step: the rows of steps it trains again move to metrics.replaced-after-stepN.csv.
TEST_F(Checkpoints, FreshRunsGetANewMetricsDirectoryAndResumedRunsAppend) {
  const fs::path runs = ckpt_ / "runs";
  const std::string monitors = R"(, "csv_monitor": {"enabled": true, "output_path": ")" +
                               runs.string() + R"(", "job_name": "j"},
      "tensorboard": {"enabled": true, "output_path": ")" +
                               runs.string() + R"(", "job_name": "j"})";
  auto events = [](const fs::path& dir) {
    int n = 0;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec))
      n += e.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
    return n;
  };
  // Run 0: 6 steps, checkpoints at 3 and 6.
  run({.steps = 6, .save_interval = 3, .extra = monitors});
  const std::vector<std::string> first = csv_lines(runs / "j" / "metrics.csv");
  ASSERT_EQ(first.size(), 7u);
  EXPECT_EQ(events(runs / "j"), 1);
  EXPECT_EQ(read_manifest((ckpt_ / "global_step6").string()).progress.csv_run, 0);

  // Resumed from step 3 (as after a crash at step 6): steps 4..6 again, appended after row 3.
  run({.steps = 6, .extra = monitors, .resume = "global_step3"});
  const std::vector<std::string> resumed = csv_lines(runs / "j" / "metrics.csv");
  ASSERT_EQ(resumed.size(), 7u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(resumed[i], first[i]) << i;  // header, steps 1..3
  for (size_t i = 4; i < 7; ++i) EXPECT_EQ(resumed[i].rfind(std::to_string(i) + ",", 0), 0u);
  // The replaced rows are kept aside, with the header.
  const std::vector<std::string> replaced =
      csv_lines(runs / "j" / "metrics.replaced-after-step3.csv");
  EXPECT_EQ(replaced, std::vector<std::string>({first[0], first[4], first[5], first[6]}));
  EXPECT_EQ(events(runs / "j"), 2);  // another events file beside the first
  EXPECT_FALSE(fs::exists(runs / "j_1"));

  // A fresh run (no resume): run 1, in j_1; run 0's files untouched.
  run({.steps = 2, .extra = monitors});
  EXPECT_EQ(csv_lines(runs / "j" / "metrics.csv"), resumed);
  EXPECT_EQ(csv_lines(runs / "j_1" / "metrics.csv").size(), 3u);
  EXPECT_EQ(events(runs / "j_1"), 1);
  EXPECT_EQ(events(runs / "j"), 2);
  // ... and the next, run 2.
  run({.steps = 4, .save_interval = 4, .extra = monitors});
  EXPECT_EQ(csv_lines(runs / "j_2" / "metrics.csv").size(), 5u);
  EXPECT_EQ(read_manifest((ckpt_ / "global_step4").string()).progress.csv_run, 2);
  // Resuming run 2's checkpoint appends to j_2, not to the newest or the first directory.
  run({.steps = 6, .extra = monitors, .resume = "global_step4"});
  EXPECT_EQ(csv_lines(runs / "j_2" / "metrics.csv").size(), 7u);
  EXPECT_EQ(csv_lines(runs / "j_1" / "metrics.csv").size(), 3u);
  EXPECT_EQ(csv_lines(runs / "j" / "metrics.csv"), resumed);
  EXPECT_FALSE(fs::exists(runs / "j_3"));
}

TEST_F(Checkpoints, AsyncSavesAreExactAndCommittedAtAStepBoundary) {
  const std::string async = R"(, "checkpoint": {"async": true})";
  const std::vector<double> whole =
      run({.world = 2, .stage = 2, .steps = 10, .save_interval = 5, .extra = async});
  // Both saves were committed: step 5 at a later step boundary, step 10 at the end of the run.
  EXPECT_EQ(read_latest(ckpt_.string()).value_or(""), "global_step10");
  EXPECT_TRUE(fs::exists(ckpt_ / "global_step5" / "manifest.json"));
  const std::vector<double> rest =
      run({.world = 2, .stage = 2, .steps = 10, .resume = "global_step5"});
  ASSERT_EQ(rest.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(rest[i], whole[5 + i]) << "step " << 6 + i;
}

// keep_last counts and removes only the job's own checkpoints: one the user saved with a tag
// stays however many automatic saves come after it.
TEST_F(Checkpoints, RetentionNeverRemovesACheckpointTheUserTagged) {
  const JobConfig cfg = tiny_job(*corpus_, 1, 0, 1, 8, "", train_extra(2, R"(, "keep_last": 1)"));
  run_world(1, [&](const RankContext& ctx) {
    Trainer t(cfg, ctx, quiet_trainer());
    t.save_checkpoint("before-run");  // the user's, at step 0
    t.run();
  });
  EXPECT_TRUE(fs::exists(ckpt_ / "before-run"));
  EXPECT_FALSE(read_manifest((ckpt_ / "before-run").string()).automatic);
  EXPECT_FALSE(fs::exists(ckpt_ / "global_step6"));
  EXPECT_TRUE(fs::exists(ckpt_ / "global_step8"));
  EXPECT_TRUE(read_manifest((ckpt_ / "global_step8").string()).automatic);
}

TEST_F(Checkpoints, RetentionKeepsTheNewestAndTornNewestFallsBack) {
  run({.world = 2,
       .stage = 1,
       .steps = 8,
       .save_interval = 2,
       .train_more = R"(, "keep_last": 2)"});
  EXPECT_FALSE(fs::exists(ckpt_ / "global_step2"));
  EXPECT_FALSE(fs::exists(ckpt_ / "global_step4"));
  EXPECT_TRUE(fs::exists(ckpt_ / "global_step6"));
  EXPECT_TRUE(fs::exists(ckpt_ / "global_step8"));
  // Flip one byte of the newest checkpoint's rank-1 file: its checksum catches it.
  const fs::path victim = ckpt_ / "global_step8" / "rank_00001.safetensors";
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(2000);
    char c;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    f.seekp(2000);
    f.write(&c, 1);
  }
  try {
    find_checkpoint(ckpt_.string(), "global_step8");
    ADD_FAILURE() << "a corrupt checkpoint loaded";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("rank_00001.safetensors"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("CRC32C"), std::string::npos) << e.what();
  }
  const FoundCheckpoint f = find_checkpoint(ckpt_.string(), "latest");
  EXPECT_EQ(f.tag, "global_step6");
  ASSERT_EQ(f.skipped.size(), 1u);
  EXPECT_NE(f.skipped[0].find("global_step8"), std::string::npos);
  // Loading checks the checksums as it reads: resuming the corrupt tag by name fails, ...
  try {
    run({.world = 2, .stage = 1, .steps = 8, .resume = "global_step8"});
    ADD_FAILURE() << "resumed from a corrupt checkpoint";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("rank_00001.safetensors"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("CRC32C"), std::string::npos) << e.what();
  }
  // ... and resuming "latest" (which names global_step8) falls back and trains on from step 6,
  // on two ranks and on one (which reads both files).
  for (int world : {2, 1}) {
    const std::vector<double> rest =
        run({.world = world, .stage = 1, .steps = 8, .resume = "latest"});
    EXPECT_EQ(rest.size(), 2u) << "world " << world;
  }
}

TEST_F(Checkpoints, BadCheckpointsAreClearErrors) {
  // Missing directory, unknown tag.
  EXPECT_THROW(run({.steps = 2, .resume = "latest"}), InputError);
  run({.steps = 2, .save_interval = 2});
  try {
    run({.steps = 4, .resume = "nope"});
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("global_step2"), std::string::npos) << e.what();
  }
  // A manifest from a future zerod.
  const fs::path manifest = ckpt_ / "global_step2" / "manifest.json";
  std::string text;
  {
    std::ifstream in(manifest);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string future = std::string(text).replace(text.find("\"format_version\": 1"),
                                                       std::string("\"format_version\": 1").size(),
                                                       "\"format_version\": 99");
  std::ofstream(manifest) << future;
  try {
    run({.steps = 4, .resume = "global_step2"});
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("99"), std::string::npos) << e.what();
  }
  std::ofstream(manifest) << text;
  // A different model shape.
  JobConfig other = tiny_job(*corpus_, 1, 0, 1, 4, "", train_extra(0));
  other.model.n_embd = 48;
  other.model.n_head = 3;
  try {
    run_world(1, [&](const RankContext& ctx) {
      Trainer t(other, ctx, quiet_trainer());
      t.resume("global_step2");
    });
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("n_embd"), std::string::npos) << e.what();
  }
  // Nothing was overwritten by the failed attempts.
  EXPECT_EQ(read_latest(ckpt_.string()).value_or(""), "global_step2");
  EXPECT_NO_THROW(find_checkpoint(ckpt_.string(), "latest"));
}

// The full fp32 master weights of every unit of a checkpoint (the unit's elements only).
std::vector<std::vector<float>> checkpoint_weights(const fs::path& ckpt,
                                                   const ParamLayout& layout) {
  const Manifest m = read_manifest(ckpt.string());
  ShardReader reader(ckpt.string(), m);
  std::vector<std::vector<float>> units(static_cast<size_t>(layout.num_units()));
  for (int u = 0; u < layout.num_units(); ++u) {
    auto& w = units[static_cast<size_t>(u)];
    w.resize(static_cast<size_t>(layout.unit(u).numel));
    reader.read(u, 0, layout.unit(u).numel, w.data(), nullptr, nullptr);
  }
  return units;
}

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST_F(Checkpoints, ExportThenInitFromGivesIdenticalWeights) {
  // Train on 2 ranks at stage 3, save, export to a Hugging Face file.
  run({.world = 2, .stage = 3, .steps = 3, .save_interval = 3});
  const fs::path exported = ckpt_ / "exported.safetensors";
  const ExportReport rep =
      export_checkpoint(ckpt_.string(), "latest", exported.string(), DType::kF32, false);
  EXPECT_EQ(rep.tag, "global_step3");
  EXPECT_EQ(rep.file.bytes, fs::file_size(exported));
  // Refuses to replace the file unless asked.
  EXPECT_THROW(export_checkpoint(ckpt_.string(), "latest", exported.string(), DType::kF32, false),
               InputError);

  // Fine-tune from it on 4 ranks at stage 1: every rank's compute weights are the checkpoint's.
  const fs::path ckpt_b = ckpt_ / "b";
  JobConfig cfg =
      tiny_job(*corpus_, 4, 1, 1, 2, "", R"(, "checkpoint_dir": ")" + ckpt_b.string() + R"(")");
  cfg.model.init_from = exported.string();
  std::vector<std::vector<float>> expected;
  std::mutex mu;
  int mismatched_units = 0;
  run_world(4, [&](const RankContext& ctx) {
    Trainer t(cfg, ctx, quiet_trainer());
    const ParamLayout& layout = t.engine().layout();
    {
      std::lock_guard<std::mutex> lock(mu);
      if (expected.empty()) expected = checkpoint_weights(ckpt_ / "global_step3", layout);
    }
    for (int u = 0; u < layout.num_units(); ++u) {
      std::vector<float> full(static_cast<size_t>(t.engine().partition().unit(u).padded));
      t.engine().gather_unit(u, full.data());
      full.resize(static_cast<size_t>(layout.unit(u).numel));
      if (full != expected[static_cast<size_t>(u)]) {
        std::lock_guard<std::mutex> lock(mu);
        ++mismatched_units;
      }
    }
    t.save_checkpoint("imported");  // before any step: the imported weights as they are
  });
  EXPECT_EQ(mismatched_units, 0);
  // Exporting the fine-tuning run's first checkpoint gives the same file, byte for byte.
  const fs::path again = ckpt_ / "again.safetensors";
  export_checkpoint(ckpt_b.string(), "imported", again.string(), DType::kF32, false);
  EXPECT_EQ(file_bytes(again), file_bytes(exported));

  // bf16 export: the importer reads back the weights rounded to bf16.
  const fs::path half = ckpt_ / "bf16.safetensors";
  const ExportReport rep16 =
      export_checkpoint(ckpt_.string(), "global_step3", half.string(), DType::kBF16, false);
  EXPECT_LT(rep16.file.bytes, rep.file.bytes * 6 / 10);
  const ParamLayout layout(
      ModelSpec{.n_layer = 2, .n_head = 2, .n_embd = 32, .vocab_size = 256, .seq_len = 24});
  int checked = 0;
  import_hf_model(half.string(), layout, [&](int u, const float* flat) {
    const auto& w = expected[static_cast<size_t>(u)];
    for (size_t i = 0; i < w.size(); ++i) {
      uint32_t bits;
      std::memcpy(&bits, &w[i], 4);
      bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;  // round to nearest even
      float r;
      std::memcpy(&r, &bits, 4);
      if (flat[i] != r) {
        ADD_FAILURE() << "unit " << u << " element " << i << ": " << flat[i] << " vs " << r;
        return;
      }
      ++checked;
    }
  });
  EXPECT_EQ(checked, static_cast<int>(std::accumulate(
                         expected.begin(), expected.end(), size_t{0},
                         [](size_t a, const std::vector<float>& v) { return a + v.size(); })));

  // A model of another shape cannot start from the file: the error names the tensors.
  JobConfig wider = tiny_job(*corpus_, 1, 0, 1, 2);
  wider.model.n_embd = 48;
  wider.model.n_head = 3;
  wider.model.init_from = exported.string();
  try {
    run_world(1, [&](const RankContext& ctx) { Trainer t(wider, ctx, quiet_trainer()); });
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("h.0.attn.c_attn.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(exported.string()), std::string::npos) << e.what();
  }
  // Exporting a missing checkpoint is a clear error.
  EXPECT_THROW(export_checkpoint(ckpt_.string(), "nope", (ckpt_ / "x.safetensors").string(),
                                 DType::kF32, false),
               InputError);
  EXPECT_FALSE(fs::exists(ckpt_ / "x.safetensors"));
}

// Two jobs on one checkpoint directory: the second is refused at start (exit 2, naming the
// holder) while the first holds it, and the first's checkpoints stay its own.
TEST_F(Checkpoints, ASecondJobOnTheSameDirectoryIsRefused) {
  const JobConfig cfg = tiny_job(*corpus_, 1, 0, 1, 4, "", train_extra(2));
  run_world(1, [&](const RankContext& ctx) {
    Trainer first(cfg, ctx, quiet_trainer());
    try {
      Trainer second(cfg, ctx, quiet_trainer());
      ADD_FAILURE() << "a second job on " << ckpt_ << " was accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("is in use by another zerod job"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("pid " + std::to_string(::getpid())), std::string::npos)
          << e.what();
    }
    first.run();
  });
  EXPECT_TRUE(fs::exists(ckpt_ / "global_step4"));
  // Once the first has ended, the directory is free again (and it resumes from it).
  EXPECT_EQ(run({.steps = 6, .resume = "latest"}).size(), 2u);
}

// A full disk during a save is the environment's fault: the job ends with InputError (exit 2)
// saying what failed and that the previous checkpoint is intact, nothing half-written is left,
// and a resume from that checkpoint continues the run exactly. (A small tmpfs is the full disk;
// mounting one needs root, which CI has.)
TEST_F(Checkpoints, AFullDiskDuringASaveIsExit2AndThePreviousCheckpointResumesExactly) {
  fs::create_directories(ckpt_);
  const std::string opts = "size=" + std::to_string(600 * 1024);
  if (::mount("tmpfs", ckpt_.c_str(), "tmpfs", 0, opts.c_str()) != 0) {
    GTEST_SKIP() << "mounting a tmpfs needs root (" << std::strerror(errno) << ")";
  }
  struct Mounted {  // unmounted on every way out of the test
    fs::path p;
    void unmount() {
      if (!p.empty()) ::umount2(p.c_str(), MNT_DETACH);
      p.clear();
    }
    ~Mounted() { unmount(); }
  } mounted{ckpt_};
  // ~420 KB per checkpoint of this model: the one at step 2 fits, the one at step 4 does not.
  const JobConfig cfg = tiny_job(*corpus_, 2, 1, 1, 6, "", train_extra(2));
  std::string message;
  try {
    run_world(2, [&](const RankContext& ctx) {
      Trainer t(cfg, ctx, quiet_trainer());
      t.run();
    });
    ADD_FAILURE() << "the job did not fail on a full disk";
  } catch (const InputError& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("checkpoint global_step4 was not saved"), std::string::npos) << message;
  EXPECT_NE(message.find(std::strerror(ENOSPC)), std::string::npos) << message;
  EXPECT_NE(message.find("the previous checkpoint global_step2 is intact"), std::string::npos)
      << message;
  EXPECT_FALSE(fs::exists(ckpt_ / "global_step4.tmp"));
  EXPECT_EQ(read_latest(ckpt_.string()).value_or(""), "global_step2");
  // Resuming from it on a disk with room continues the losses of an uninterrupted run.
  const fs::path saved = ckpt_.string() + "_copy";
  fs::remove_all(saved);
  fs::copy(ckpt_, saved, fs::copy_options::recursive);
  mounted.unmount();
  fs::remove_all(ckpt_);
  fs::rename(saved, ckpt_);
  fs::remove_all(ckpt_ / "global_step4.tmp");
  const std::vector<double> resumed = run({.world = 2, .stage = 1, .steps = 6, .resume = "latest"});
  fs::remove_all(ckpt_);
  const std::vector<double> whole = run({.world = 2, .stage = 1, .steps = 6});
  ASSERT_EQ(resumed.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(resumed[i], whole[2 + i]) << "step " << 3 + i;
}

INSTANTIATE_TEST_SUITE_P(Models, ModelCheckpoints,
                         ::testing::Values(testing::tiny_gpt2(), testing::tiny_llama()),
                         [](const auto& info) { return std::string(info.param.name); });

// Tensor-parallel checkpoints: each tensor rank saves its parts; loading puts them back together
// for any tensor-parallel size, data-parallel size and stage, and export gathers them into the
// plain Hugging Face tensors.
class TensorParallelCheckpoints : public Checkpoints,
                                  public ::testing::WithParamInterface<TinyModel> {
 protected:
  static std::string tp(int T) {
    return R"(, "parallelism": {"tensor": )" + std::to_string(T) + "}";
  }
};

TEST_P(TensorParallelCheckpoints, ResumeIsExactAtTheSameMeshAndReshardsAcrossTensorAndData) {
  const TinyModel model = GetParam();
  // T=2 x DP=2 saves at step 5; resuming at the same mesh continues bitwise.
  run({.world = 4, .stage = 1, .steps = 5, .save_interval = 5, .extra = tp(2), .model = model});
  const Manifest saved = read_manifest((ckpt_ / "global_step5").string());
  EXPECT_EQ(saved.tensor_parallel, 2);
  std::set<int> tensor_ranks;
  for (const CheckpointFile& f : saved.files) tensor_ranks.insert(f.tensor_rank);
  EXPECT_EQ(tensor_ranks, (std::set<int>{0, 1}));
  const std::vector<double> same = run(
      {.world = 4, .stage = 1, .steps = 10, .extra = tp(2), .resume = "latest", .model = model});
  struct To {
    int world, stage, tensor;
  };
  std::vector<std::pair<To, std::vector<double>>> resumed;
  for (const To to : {To{4, 2, 1}, To{4, 3, 4}, To{1, 0, 1}}) {
    resumed.push_back({to, run({.world = to.world,
                                .stage = to.stage,
                                .steps = 10,
                                .extra = to.tensor > 1 ? tp(to.tensor) : "",
                                .resume = "global_step5",
                                .model = model})});
  }
  fs::remove_all(ckpt_);
  const std::vector<double> uninterrupted =
      run({.world = 4, .stage = 1, .steps = 10, .extra = tp(2), .model = model});
  ASSERT_EQ(same.size(), 5u);
  for (size_t i = 0; i < 5; ++i)
    EXPECT_EQ(same[i], uninterrupted[5 + i]) << "T=2 x DP=2 resumed, step " << 6 + i;
  for (const auto& [to, losses] : resumed) {
    ASSERT_EQ(losses.size(), 5u);
    for (size_t i = 0; i < 5; ++i) {
      EXPECT_NEAR(losses[i], uninterrupted[5 + i], 1e-5 * uninterrupted[5 + i])
          << "T=2 x DP=2 stage 1 -> T=" << to.tensor << " x DP=" << to.world / to.tensor
          << " stage " << to.stage << ", step " << 6 + i;
    }
  }
}

TEST_P(TensorParallelCheckpoints, ExportGathersTheTensorPartsIntoTheSingleRankTensors) {
  const TinyModel model = GetParam();
  run({.world = 2, .stage = 2, .steps = 3, .save_interval = 3, .extra = tp(2), .model = model});
  const fs::path from_tp = ckpt_ / "tp.safetensors";
  export_checkpoint(ckpt_.string(), "latest", from_tp.string(), DType::kF32, false);
  fs::rename(ckpt_ / "global_step3", ckpt_ / "tp_step3");
  run({.world = 1, .steps = 3, .save_interval = 3, .model = model});
  const fs::path from_one = ckpt_ / "one.safetensors";
  export_checkpoint(ckpt_.string(), "global_step3", from_one.string(), DType::kF32, false);
  const JobConfig cfg = tiny_job(*corpus_, 1, 0, 1, 1, "", "", 8, "", model);
  const ParamLayout layout(model_spec(cfg.model));
  std::vector<std::vector<float>> b;
  int units = 0;
  import_hf_model(from_one.string(), layout, [&](int u, const float* f) {
    std::vector<float> one(f, f + layout.unit(u).numel);
    b.push_back(std::move(one));
    ++units;
  });
  std::vector<std::vector<float>> tpw;
  import_hf_model(from_tp.string(), layout,
                  [&](int u, const float* f) { tpw.emplace_back(f, f + layout.unit(u).numel); });
  ASSERT_EQ(static_cast<int>(tpw.size()), units);
  double worst = 0;
  for (size_t u = 0; u < tpw.size(); ++u)
    for (size_t i = 0; i < tpw[u].size(); ++i)
      worst = std::max(worst, std::fabs(double{tpw[u][i]} - b[u][i]));
  EXPECT_LT(worst, 1e-5) << "exported T=2 weights against T=1's after 3 steps";
}

INSTANTIATE_TEST_SUITE_P(Models, TensorParallelCheckpoints,
                         ::testing::Values(testing::tiny_gpt2_split4(),
                                           testing::tiny_llama_split4()),
                         [](const auto& info) { return std::string(info.param.name); });

// Pipeline checkpoints: every stage saves its own units under the whole model's unit indices (the
// last stage's tied-embedding copy is the first stage's, saved once), so the checkpoint is the
// same whatever P: saved at P = 2 x DP = 2 it resumes bitwise at the same mesh and reshards to
// P = 1 x DP = 4 and P = 4 x DP = 1 within 1e-5 of the uninterrupted run.
class PipelineCheckpoints : public Checkpoints, public ::testing::WithParamInterface<TinyModel> {
 protected:
  static std::string pp(int P) {
    return R"(, "parallelism": {"pipeline": )" + std::to_string(P) + "}";
  }
};

TEST_P(PipelineCheckpoints, ResumeIsExactAtTheSameMeshAndReshardsAcrossStagesAndData) {
  const TinyModel model = GetParam();
  run({.world = 4,
       .stage = 1,
       .accum = 2,
       .steps = 5,
       .save_interval = 5,
       .extra = pp(2),
       .model = model});
  const Manifest saved = read_manifest((ckpt_ / "global_step5").string());
  const ParamLayout whole(model_spec(tiny_job(*corpus_, 1, 0, 1, 1, "", "", 8, "", model).model));
  ASSERT_EQ(saved.units.size(), static_cast<size_t>(whole.num_units()));
  // Every unit saved exactly once over the files (ZeRO-1: two data-parallel shards per stage).
  std::map<int, int64_t> covered;
  for (const CheckpointFile& f : saved.files)
    for (const ShardSlice& sl : f.slices) covered[sl.unit] += sl.end - sl.begin;
  ASSERT_EQ(covered.size(), static_cast<size_t>(whole.num_units()));
  for (const auto& [u, n] : covered) EXPECT_EQ(n, whole.unit(u).numel) << whole.unit(u).name;
  const std::vector<double> same = run({.world = 4,
                                        .stage = 1,
                                        .accum = 2,
                                        .steps = 10,
                                        .extra = pp(2),
                                        .resume = "latest",
                                        .model = model});
  const std::vector<double> one_stage = run(
      {.world = 4, .stage = 2, .accum = 2, .steps = 10, .resume = "global_step5", .model = model});
  const std::vector<double> four_stages = run({.world = 4,
                                               .stage = 0,
                                               .accum = 4,
                                               .steps = 10,
                                               .extra = pp(4),
                                               .resume = "global_step5",
                                               .model = model});
  fs::remove_all(ckpt_);
  const std::vector<double> uninterrupted =
      run({.world = 4, .stage = 1, .accum = 2, .steps = 10, .extra = pp(2), .model = model});
  ASSERT_EQ(same.size(), 5u);
  ASSERT_EQ(one_stage.size(), 5u);
  ASSERT_EQ(four_stages.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    const double want = uninterrupted[5 + i];
    EXPECT_EQ(same[i], want) << "P=2 x DP=2 resumed, step " << 6 + i;
    EXPECT_NEAR(one_stage[i], want, 1e-5 * want) << "P=2 x DP=2 -> P=1 x DP=4, step " << 6 + i;
    EXPECT_NEAR(four_stages[i], want, 1e-5 * want) << "P=2 x DP=2 -> P=4, step " << 6 + i;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, PipelineCheckpoints,
                         ::testing::Values(testing::tiny_gpt2_4layers(),
                                           testing::tiny_llama_4layers()),
                         [](const auto& info) { return std::string(info.param.name); });

// Context-parallel checkpoints: the parameters do not depend on C (ZeRO shards them over data x
// context), so a checkpoint of C = 2 x DP = 2 resumes exactly at the same mesh and reshards to
// one rank, to C = 2 with the other attention and to T = 2 x C = 2.
class ContextParallelCheckpoints : public Checkpoints,
                                   public ::testing::WithParamInterface<TinyModel> {
 protected:
  static std::string cp(int C, const char* impl, int T = 1) {
    return R"(, "parallelism": {"context": )" + std::to_string(C) + R"(, "context_impl": ")" +
           impl + R"(", "tensor": )" + std::to_string(T) + "}";
  }
};

TEST_P(ContextParallelCheckpoints, ResumeIsExactAtTheSameMeshAndReshardsAcrossContext) {
  const TinyModel model = GetParam();
  run({.world = 4,
       .stage = 1,
       .steps = 5,
       .save_interval = 5,
       .extra = cp(2, "ring"),
       .model = model});
  const std::vector<double> same = run({.world = 4,
                                        .stage = 1,
                                        .steps = 10,
                                        .extra = cp(2, "ring"),
                                        .resume = "latest",
                                        .model = model});
  struct To {
    int world, stage;
    std::string extra;
  };
  std::vector<std::pair<std::string, std::vector<double>>> resumed;
  for (const To& to : {To{1, 0, ""}, To{2, 2, cp(2, "ulysses")}, To{4, 3, cp(2, "ulysses", 2)}}) {
    resumed.push_back({to.extra, run({.world = to.world,
                                      .stage = to.stage,
                                      .steps = 10,
                                      .extra = to.extra,
                                      .resume = "global_step5",
                                      .model = model})});
  }
  fs::remove_all(ckpt_);
  const std::vector<double> uninterrupted =
      run({.world = 4, .stage = 1, .steps = 10, .extra = cp(2, "ring"), .model = model});
  ASSERT_EQ(same.size(), 5u);
  for (size_t i = 0; i < 5; ++i)
    EXPECT_EQ(same[i], uninterrupted[5 + i]) << "C=2 x DP=2 resumed, step " << 6 + i;
  for (const auto& [to, losses] : resumed) {
    ASSERT_EQ(losses.size(), 5u) << to;
    for (size_t i = 0; i < 5; ++i) {
      EXPECT_NEAR(losses[i], uninterrupted[5 + i], 1e-5 * uninterrupted[5 + i])
          << "C=2 x DP=2 stage 1 -> '" << to << "', step " << 6 + i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ContextParallelCheckpoints,
                         ::testing::Values(testing::tiny_gpt2_split4(),
                                           testing::tiny_llama_split4()),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace zerod
