// offload_optimizer device nvme (ZeRO-Infinity) and partial cpu offload (ratio): the losses are
// bit-identical to the same run without offload at stages 1, 2 and 3; the host holds only the
// swap buffers while the file holds the states; checkpoints read the states from NVMe and
// resume puts them back (bitwise, and across offload settings); the preflight refuses bad
// folders with the numbers; an I/O error stops training with the file and offset named while
// the last checkpoint stays loadable.
#include <gtest/gtest.h>
#include <sys/mount.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "core/error.h"
#include "engine/checkpoint/checkpoint_dir.h"
#include "engine/config/model_spec.h"
#include "engine/train/offload_preflight.h"
#include "train_test_util.h"

namespace zerod {
namespace {

namespace fs = std::filesystem;
using testing::quiet_trainer;
using testing::run_world;
using testing::TempCorpus;
using testing::tiny_job;

class OffloadNvme : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { corpus_ = new TempCorpus("zerod_nvme_corpus"); }
  static void TearDownTestSuite() { delete corpus_; }
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("zerod_nvme_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_ / "nvme");
  }
  void TearDown() override {
    ::unsetenv("ZEROD_AIO_FAULT");
    fs::remove_all(root_);
  }

  struct Spec {
    int world = 2, stage = 1, steps = 4, save_interval = 0;
    std::string dtype = "";       // "" fp32, else a top-level member such as the bf16 section
    std::string device = "none";  // none | cpu | nvme
    int64_t sub_group = 4096;
    int buffers = 3;
    bool pipeline = true;
    double ratio = 1.0;
    std::string resume = "";
    std::string param = "none";  // offload_param.device (stage 3)
    int64_t max_in_cpu = 5000;   // elements: the embedding shard (4480 at world 2) stays in RAM
    int64_t param_buffer = 100000000;
  };
  struct Result {
    std::vector<double> losses;
    ModelStateBytes measured, formula;
    int64_t swap_peak = 0;
    int groups = 0;
    double io_seconds = 0, step_seconds = 0;  // offload I/O wait; the steps' wall time
  };
  JobConfig job(const Spec& s) const {
    const std::string train = R"(, "checkpoint_dir": ")" + (root_ / "ckpt").string() +
                              R"(", "save_interval": )" + std::to_string(s.save_interval);
    JobConfig cfg = tiny_job(*corpus_, s.world, s.stage, 2, s.steps, s.dtype, train);
    OffloadOptimizerConfig& oo = cfg.zero.offload_optimizer;
    if (s.device == "cpu") oo.device = OffloadDevice::kCpu;
    if (s.device == "nvme") {
      oo.device = OffloadDevice::kNvme;
      oo.nvme_path = (root_ / "nvme").string();
    }
    oo.buffer_count = s.buffers;
    oo.pipeline_read = oo.pipeline_write = s.pipeline;
    oo.ratio = s.ratio;
    cfg.zero.sub_group_size = s.sub_group;
    OffloadParamConfig& op = cfg.zero.offload_param;
    if (s.param == "cpu") op.device = OffloadDevice::kCpu;
    if (s.param == "nvme") {
      op.device = OffloadDevice::kNvme;
      op.nvme_path = (root_ / "nvme").string();
    }
    op.max_in_cpu = s.max_in_cpu;
    op.buffer_size = s.param_buffer;
    return cfg;
  }
  Result run(const Spec& s) {
    const JobConfig cfg = job(s);
    Result out;
    std::mutex mu;
    run_world(s.world, [&](const RankContext& ctx) {
      Trainer t(cfg, ctx, quiet_trainer());
      if (!s.resume.empty()) t.resume(s.resume);
      const TrainResult r = t.run();
      if (ctx.rank != 0) return;
      std::lock_guard<std::mutex> lock(mu);
      for (const auto& st : r.steps) out.losses.push_back(st.loss);
      out.measured = t.engine().measured_bytes();
      out.formula = t.engine().formula_bytes();
      out.swap_peak = t.memory().peak(MemCategory::kSwap);
      out.io_seconds = r.offload_io_seconds;
      for (const auto& st : r.steps) out.step_seconds += st.seconds;
      if (t.engine().swapper()) out.groups = t.engine().swapper()->num_groups();
    });
    return out;
  }

  static TempCorpus* corpus_;
  fs::path root_;
};

TempCorpus* OffloadNvme::corpus_ = nullptr;

TEST_F(OffloadNvme, SameLossesAtEveryStageInFp32AndBf16) {
  for (const std::string dtype : {"", R"(, "bf16": {"enabled": true})"}) {
    for (int stage : {1, 2, 3}) {
      const std::string what =
          "stage " + std::to_string(stage) + (dtype.empty() ? " fp32" : " bf16");
      const Result base = run({.stage = stage, .dtype = dtype});
      // Stage 2 without the pipeline and with one buffer: the plain swap-in/update/swap-out path.
      const Result nvme = run({.stage = stage,
                               .dtype = dtype,
                               .device = "nvme",
                               .buffers = stage == 2 ? 1 : 3,
                               .pipeline = stage != 2});
      ASSERT_EQ(base.losses.size(), 4u) << what;
      EXPECT_EQ(base.losses, nvme.losses) << what;  // bit-identical
      EXPECT_GT(nvme.groups, 3) << what;            // the step really went sub-group by sub-group
      EXPECT_EQ(nvme.measured.master, 0) << what;
      EXPECT_EQ(nvme.measured.moments, 0) << what;
      EXPECT_EQ(nvme.measured.host, 0) << what;
      EXPECT_EQ(nvme.measured.weights, base.measured.weights) << what;
    }
  }
  // Nothing is left behind in nvme_path.
  EXPECT_TRUE(fs::is_empty(root_ / "nvme"));
}

TEST_F(OffloadNvme, HostHoldsTheSwapBuffersWhileTheDiskHoldsTheStates) {
  const Result r = run({.world = 1, .stage = 1, .device = "nvme", .sub_group = 1024, .buffers = 2});
  const int64_t buffer = 12 * 1024;  // one sub-group's master, exp_avg and exp_avg_sq
  EXPECT_EQ(r.swap_peak, 2 * buffer);
  EXPECT_EQ(r.measured.swap_buffers, r.swap_peak);
  EXPECT_EQ(r.formula.swap_buffers, 2 * buffer);
  // The states on disk: 12 bytes per shard element, many times the host buffers.
  EXPECT_GE(r.measured.nvme, 12 * r.measured.weights / 4);
  EXPECT_GE(r.measured.nvme, 8 * r.swap_peak);
  EXPECT_NEAR(static_cast<double>(r.measured.nvme), static_cast<double>(r.formula.nvme),
              0.05 * static_cast<double>(r.formula.nvme));
  // Host memory in all: no master or moments outside the swap buffers.
  EXPECT_EQ(r.measured.master + r.measured.moments + r.measured.host, 0);
  // The breakdown's offload I/O wait is measured, and part of the steps' time (it includes the
  // wait for the last step's write-behind when the next step's prefetch starts).
  EXPECT_GT(r.io_seconds, 0);
  EXPECT_LT(r.io_seconds, r.step_seconds);
  EXPECT_EQ(run({.world = 1, .stage = 1}).io_seconds, 0);
}

TEST_F(OffloadNvme, PartialCpuOffloadKeepsTheRestInTheComputePool) {
  const Result base = run({.stage = 3});
  const Result half = run({.stage = 3, .device = "cpu", .ratio = 0.5});
  const Result all = run({.stage = 3, .device = "cpu"});
  EXPECT_EQ(base.losses, half.losses);
  EXPECT_EQ(base.losses, all.losses);
  const int64_t states = all.measured.host;  // master + moments, all on the host
  EXPECT_GT(half.measured.host, 0);
  EXPECT_GT(half.measured.master + half.measured.moments, 0);
  EXPECT_EQ(half.measured.host + half.measured.master + half.measured.moments, states);
  // The split falls on a unit boundary near the ratio.
  EXPECT_NEAR(static_cast<double>(half.measured.host) / static_cast<double>(states), 0.5, 0.3);
  EXPECT_EQ(all.measured.master + all.measured.moments, 0);
}

TEST_F(OffloadNvme, CheckpointsOfNvmeStatesResumeExactlyAndAcrossOffloadSettings) {
  const Result whole = run({.stage = 2, .steps = 8, .device = "nvme"});
  fs::remove_all(root_ / "ckpt");
  run({.stage = 2, .steps = 4, .save_interval = 4, .device = "nvme"});
  ASSERT_TRUE(fs::exists(root_ / "ckpt" / "global_step4"));
  const Result resumed = run({.stage = 2, .steps = 8, .device = "nvme", .resume = "global_step4"});
  ASSERT_EQ(resumed.losses.size(), 4u);
  EXPECT_EQ(std::vector<double>(whole.losses.begin() + 4, whole.losses.end()), resumed.losses);
  // The same checkpoint resumes without offload, and at another stage and world size with it.
  const Result plain = run({.stage = 2, .steps = 8, .resume = "global_step4"});
  EXPECT_EQ(resumed.losses, plain.losses);
  const Result other =
      run({.world = 1, .stage = 1, .steps = 8, .device = "nvme", .resume = "global_step4"});
  ASSERT_EQ(other.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(other.losses[i], resumed.losses[i], 1e-5);
  // A checkpoint saved without offload resumes into NVMe states.
  fs::remove_all(root_ / "ckpt");
  run({.stage = 3, .steps = 4, .save_interval = 4});
  const Result into = run({.stage = 3, .steps = 8, .device = "nvme", .resume = "global_step4"});
  EXPECT_EQ(std::vector<double>(whole.losses.begin() + 4, whole.losses.end()).size(),
            into.losses.size());
  const Result ref = run({.stage = 3, .steps = 8, .resume = "global_step4"});
  EXPECT_EQ(ref.losses, into.losses);
}

TEST_F(OffloadNvme, AnIoErrorStopsTrainingNamingTheFileAndTheLastCheckpointStaysIntact) {
  // World 1, sub-groups of 2048: the init writes every sub-group once, each step writes them
  // all again; fail the first write of step 4 (after the checkpoint of step 2).
  Spec s{
      .world = 1, .stage = 1, .steps = 6, .save_interval = 2, .device = "nvme", .sub_group = 2048};
  const JobConfig cfg = job(s);
  int groups = 0;
  {
    Trainer probe(cfg, quiet_trainer());
    groups = probe.engine().swapper()->num_groups();
  }
  const std::string fault = "EIO:write:" + std::to_string(4 * groups + 1) + ":optimizer.swp";
  ::setenv("ZEROD_AIO_FAULT", fault.c_str(), 1);
  int64_t steps_done = 0;
  try {
    TrainerOptions o = quiet_trainer();
    o.on_step = [&](const StepMetrics& m) { steps_done = m.step; };
    Trainer t(cfg, o);
    t.run();
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find((root_ / "nvme").string()), std::string::npos) << what;
    EXPECT_NE(what.find("write at offset"), std::string::npos) << what;
    EXPECT_NE(what.find("Input/output error"), std::string::npos) << what;
  }
  ::unsetenv("ZEROD_AIO_FAULT");
  EXPECT_EQ(steps_done, 3);
  // The checkpoint of step 2 is complete and verified; resuming from it finishes the run with
  // the losses of an uninterrupted one.
  EXPECT_EQ(find_checkpoint((root_ / "ckpt").string(), "latest").tag, "global_step2");
  s.resume = "latest";
  const Result resumed = run(s);
  fs::remove_all(root_ / "ckpt");
  s.resume = "";
  s.save_interval = 0;
  const Result whole = run(s);
  ASSERT_EQ(resumed.losses.size(), 4u);
  EXPECT_EQ(std::vector<double>(whole.losses.begin() + 2, whole.losses.end()), resumed.losses);
  EXPECT_TRUE(fs::is_empty(root_ / "nvme"));
}

TEST_F(OffloadNvme, ParameterOffloadAtStage3GivesTheSameLosses) {
  for (const std::string dtype : {"", R"(, "bf16": {"enabled": true})"}) {
    const Result base = run({.stage = 3, .dtype = dtype});
    for (const std::string param : {"cpu", "nvme"}) {
      for (const std::string opt : {"none", "cpu", "nvme"}) {
        const std::string what =
            "params " + param + ", optimizer " + opt + (dtype.empty() ? " fp32" : " bf16");
        const Result r = run({.stage = 3, .dtype = dtype, .device = opt, .param = param});
        EXPECT_EQ(base.losses, r.losses) << what;
        // The weight shards left the compute pool: for host memory, or (all but the embedding,
        // which fits in max_in_cpu) for the disk.
        EXPECT_EQ(r.measured.weights, 0) << what;
        EXPECT_GT(r.measured.host, 0) << what;
        if (param == "nvme") {
          EXPECT_GT(r.measured.nvme, base.measured.weights / 2) << what;
          // (Files round up: each unit's region to 4 KiB, the last optimizer sub-group to a
          // whole one of 4096 elements.)
          EXPECT_NEAR(static_cast<double>(r.measured.nvme), static_cast<double>(r.formula.nvme),
                      0.05 * static_cast<double>(r.formula.nvme) + 4 * 4096 + 12 * 4096)
              << what;
        }
      }
    }
  }
  // Every unit in RAM (max_in_cpu above the shard: nothing on disk) ...
  const Result in_cpu = run({.stage = 3, .param = "nvme", .max_in_cpu = 1000000000});
  EXPECT_EQ(run({.stage = 3}).losses, in_cpu.losses);
  EXPECT_EQ(in_cpu.measured.nvme, 0);
  // ... and every unit on NVMe (max_in_cpu 0) work too, and checkpoints resume exactly.
  const Result whole = run({.stage = 3, .steps = 8, .param = "nvme", .max_in_cpu = 0});
  run({.stage = 3, .steps = 4, .save_interval = 4, .param = "nvme", .max_in_cpu = 0});
  const Result resumed =
      run({.stage = 3, .steps = 8, .resume = "global_step4", .param = "nvme", .max_in_cpu = 0});
  EXPECT_EQ(std::vector<double>(whole.losses.begin() + 4, whole.losses.end()), resumed.losses);
  EXPECT_TRUE(fs::is_empty(root_ / "nvme"));
}

TEST_F(OffloadNvme, AParameterBufferSmallerThanAShardIsRefused) {
  try {
    run({.stage = 3, .param = "nvme", .param_buffer = 1000});
    FAIL() << "no error";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("zero_optimization.offload_param.buffer_size: 1000 elements"),
              std::string::npos)
        << what;
  }
}

TEST_F(OffloadNvme, SwapFilesOfKilledRunsOnThisHostAreRemovedAtStart) {
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof(host) - 1), 0);
  const fs::path nvme = root_ / "nvme";
  const std::string mine = std::string("zerod-") + host + "-";
  auto touch = [&](const std::string& name) { std::ofstream(nvme / name) << "x"; };
  touch(mine + "999999999-rank0.optimizer.swp");                 // no such process: stale
  touch(mine + "999999998-rank1.params.swp");                    // stale
  touch(mine + "1-rank0.optimizer.swp");                         // pid 1 is alive: kept
  touch("zerod-some-other-host-999999999-rank0.optimizer.swp");  // another host's: kept
  touch("notes.swp");                                            // not ours: kept
  run({.world = 1, .stage = 1, .steps = 1, .device = "nvme"});
  EXPECT_FALSE(fs::exists(nvme / (mine + "999999999-rank0.optimizer.swp")));
  EXPECT_FALSE(fs::exists(nvme / (mine + "999999998-rank1.params.swp")));
  EXPECT_TRUE(fs::exists(nvme / (mine + "1-rank0.optimizer.swp")));
  EXPECT_TRUE(fs::exists(nvme / "zerod-some-other-host-999999999-rank0.optimizer.swp"));
  EXPECT_TRUE(fs::exists(nvme / "notes.swp"));
  // The run's own files are gone too (removed at its end), so exactly the three kept remain.
  int64_t left = 0;
  for (const auto& e : fs::directory_iterator(nvme)) left += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(left, 3);
  for (const auto& e : fs::directory_iterator(nvme)) fs::remove(e.path());
}

TEST_F(OffloadNvme, PreflightRefusesABadFolderWithTheNumbers) {
  auto refused = [&](const std::string& nvme_path, const std::string& want) {
    JobConfig cfg = job({.world = 1, .device = "nvme"});
    cfg.zero.offload_optimizer.nvme_path = nvme_path;
    try {
      Trainer t(cfg, quiet_trainer());
      ADD_FAILURE() << nvme_path << ": no error";
    } catch (const InputError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("zero_optimization.offload_optimizer.nvme_path"), std::string::npos)
          << what;
      EXPECT_NE(what.find(want), std::string::npos) << what;
      EXPECT_NE(what.find("disk"), std::string::npos) << what;  // the plan
    }
  };
  refused((root_ / "missing").string(), "does not exist");
  std::ofstream((root_ / "file").string()) << "x";
  refused((root_ / "file").string(), "is not a folder");
  refused("/proc/self", "is not writable");
  // The plan's numbers: the disk bytes are what the swapper will allocate.
  const JobConfig cfg = job({.world = 2, .stage = 2, .device = "nvme", .sub_group = 4096});
  const OffloadPlan p = plan_offload(cfg, ParamLayout(model_spec(cfg.model)), 2, 4);
  EXPECT_EQ(p.disk % (12 * 4096), 0);
  EXPECT_EQ(p.host, 3 * 12 * 4096);
  // Parameters on NVMe: the disk holds the weight shards in the backend's element size (4 bytes
  // on the CPU even for bf16, 2 on a GPU), as the parameter swapper allocates them.
  const Spec params_on_nvme{
      .world = 2, .stage = 3, .dtype = R"(, "bf16": {"enabled": true})", .param = "nvme"};
  const JobConfig pcfg = job(params_on_nvme);
  const ParamLayout playout(model_spec(pcfg.model));
  const OffloadPlan p4 = plan_offload(pcfg, playout, 2, 4), p2 = plan_offload(pcfg, playout, 2, 2);
  EXPECT_GT(p4.param_disk, p2.param_disk);
  EXPECT_EQ(p4.param_disk, run(params_on_nvme).measured.nvme) << "the plan is what is allocated";
  // A folder on a file system too small for the swap files.
  const fs::path small = root_ / "small";
  fs::create_directories(small);
  if (::mount("tmpfs", small.c_str(), "tmpfs", 0, "size=64k") != 0) {
    GTEST_SKIP() << "cannot mount a small tmpfs here (needs root): " << std::strerror(errno);
  }
  refused(small.string(), "bytes (0.06 MiB) free; the swap files of this process's ranks need");
  ::umount(small.c_str());
}

}  // namespace
}  // namespace zerod
