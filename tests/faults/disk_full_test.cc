// Faults at every I/O of a checkpoint save, on ranks as threads: each write, fsync and rename of
// the second save fails in turn (ENOSPC as a full disk, EIO as a failing disk; core/fault_points.h
// injects them). Every time, the job ends with the right kind of error (a full disk is exit 2,
// naming the file and that the previous checkpoint is intact; EIO is a machine failure, exit 1
// but not a bug), nothing half-written stays, `latest` names a complete checkpoint, and resuming
// from it continues the uninterrupted run's losses exactly.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "../unit/engine/train/train_test_util.h"
#include "core/fault_points.h"
#include "engine/checkpoint/checkpoint_dir.h"
#include "engine/checkpoint/manifest.h"

namespace zerod {
namespace {

namespace fs = std::filesystem;
using testing::quiet_trainer;
using testing::run_world;
using testing::TempCorpus;
using testing::tiny_job;

constexpr int kWorld = 2;
constexpr int kSteps = 6;
constexpr int kSaveInterval = 2;  // saves at steps 2, 4 and 6; the faults hit the one at step 4

class DiskFull : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { corpus_ = new TempCorpus("zerod_faults_corpus"); }
  static void TearDownTestSuite() { delete corpus_; }
  void SetUp() override {
    ckpt_ = fs::temp_directory_path() /
            ("zerod_faults_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(ckpt_);
  }
  void TearDown() override {
    set_faults("");
    fs::remove_all(ckpt_);
  }

  // Losses of the steps a run trained (rank 0's), up to `steps`, from `resume` when given.
  std::vector<double> run(int steps, const std::string& resume = "") {
    const JobConfig cfg = tiny_job(*corpus_, kWorld, 1, 1, steps, "",
                                   R"(, "checkpoint_dir": ")" + ckpt_.string() +
                                       R"(", "save_interval": )" + std::to_string(kSaveInterval));
    std::vector<double> losses;
    std::mutex mu;
    run_world(kWorld, [&](const RankContext& ctx) {
      Trainer t(cfg, ctx, quiet_trainer());
      if (!resume.empty()) t.resume(resume);
      const TrainResult res = t.run();
      if (ctx.rank != 0) return;
      std::lock_guard<std::mutex> lock(mu);
      for (const auto& s : res.steps) losses.push_back(s.loss);
    });
    return losses;
  }

  // How often each point is reached by one save (of every rank together).
  std::map<std::string, int> arrivals_per_save() {
    set_faults("count");
    run(kSaveInterval);  // exactly one save
    std::map<std::string, int> n;
    for (const char* p : {"save.write", "save.fsync", "save.rename"}) n[p] = fault_hits(p);
    set_faults("");
    fs::remove_all(ckpt_);
    return n;
  }

  // After a failed run: no TAG.tmp is left, `latest` names a complete checkpoint (its manifest
  // reads and every file it lists has the recorded size), which is returned.
  std::string check_left_behind(const std::string& what) {
    for (const auto& e : fs::directory_iterator(ckpt_)) {
      const std::string name = e.path().filename().string();
      EXPECT_FALSE(name.size() > 4 && name.substr(name.size() - 4) == ".tmp" && e.is_directory())
          << what << ": " << name << " was left behind";
    }
    const auto latest = read_latest(ckpt_.string());
    EXPECT_TRUE(latest.has_value()) << what << ": no latest";
    if (!latest) return "";
    const Manifest m = read_manifest((ckpt_ / *latest).string());
    for (const CheckpointFile& f : m.files) {
      EXPECT_EQ(static_cast<int64_t>(fs::file_size(ckpt_ / *latest / f.name)), f.bytes)
          << what << ": " << *latest << "/" << f.name;
    }
    return *latest;
  }

  static TempCorpus* corpus_;
  fs::path ckpt_;
};

TempCorpus* DiskFull::corpus_ = nullptr;

TEST_F(DiskFull, EveryIoOfASaveFailingWithEnospcIsExit2AndResumesExactly) {
  const std::map<std::string, int> per_save = arrivals_per_save();
  // Rank files, manifest and latest are written; each is fsynced, and so are the directories;
  // TAG.tmp -> TAG and latest.tmp -> latest publish the save.
  ASSERT_GE(per_save.at("save.write"), kWorld + 2);
  ASSERT_GE(per_save.at("save.fsync"), kWorld + 4);
  ASSERT_EQ(per_save.at("save.rename"), 2);
  const std::vector<double> whole = run(kSteps);
  ASSERT_EQ(whole.size(), static_cast<size_t>(kSteps));
  fs::remove_all(ckpt_);
  int cases = 0;
  for (const auto& [point, n] : per_save) {
    for (int k = 1; k <= n; ++k) {
      const std::string spec = point + "@" + std::to_string(n + k) + "=enospc";
      SCOPED_TRACE(spec);
      fs::remove_all(ckpt_);
      set_faults(spec);
      std::string message;
      try {
        run(kSteps);
        ADD_FAILURE() << spec << ": the job did not fail";
      } catch (const InputError& e) {
        message = e.what();
      }
      set_faults("");
      EXPECT_EQ(fault_hits(point), 0);
      EXPECT_NE(message.find(std::strerror(ENOSPC)), std::string::npos) << message;
      EXPECT_NE(message.find("bytes are free"), std::string::npos) << message;
      const std::string latest = check_left_behind(spec);
      // The save failed before or after `latest` moved; either way the message names the
      // checkpoint that `latest` names as intact.
      EXPECT_TRUE(latest == "global_step2" || latest == "global_step4") << latest;
      EXPECT_NE(message.find("the previous checkpoint " + latest + " is intact"), std::string::npos)
          << message;
      // Resuming from it on a disk with room continues the uninterrupted losses exactly.
      const int from = std::stoi(latest.substr(std::strlen("global_step")));
      const std::vector<double> resumed = run(kSteps, "latest");
      ASSERT_EQ(resumed.size(), static_cast<size_t>(kSteps - from)) << message;
      for (int s = from; s < kSteps; ++s) {
        EXPECT_EQ(resumed[s - from], whole[s]) << spec << ": step " << s + 1;
      }
      ++cases;
    }
  }
  EXPECT_GE(cases, 3 * kWorld + 6);
}

// EIO (a failing disk) at the first write, fsync and rename of a save is the machine's failure:
// exit 1 reported as such, not as a bug, and not as the user's input; nothing half-written stays.
TEST_F(DiskFull, EioDuringASaveIsASystemErrorAndLeavesThePreviousCheckpoint) {
  const std::map<std::string, int> per_save = arrivals_per_save();
  for (const auto& [point, n] : per_save) {
    const std::string spec = point + "@" + std::to_string(n + 1) + "=eio";
    SCOPED_TRACE(spec);
    fs::remove_all(ckpt_);
    set_faults(spec);
    try {
      run(kSteps);
      ADD_FAILURE() << spec << ": the job did not fail";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kSystem) << e.what();
      EXPECT_EQ(e.exit_code(), 1) << e.what();
      EXPECT_NE(std::string(e.what()).find(std::strerror(EIO)), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("the previous checkpoint global_step2 is intact"),
                std::string::npos)
          << e.what();
    }
    set_faults("");
    EXPECT_EQ(check_left_behind(spec), "global_step2");
  }
}

TEST(FaultSpec, MalformedSpecsAreRefusedNamingTheEntry) {
  for (const char* bad : {"save.write", "save.write@0=kill", "save.write@x=kill",
                          "save.write@1=explode", "@1=kill"}) {
    try {
      set_faults(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
  set_faults("a@2=eio,b@1=enospc");
  EXPECT_EQ(fault_point("a"), 0);
  EXPECT_EQ(fault_point("b"), ENOSPC);
  EXPECT_EQ(fault_point("a"), EIO);
  EXPECT_EQ(fault_point("a"), 0);
  EXPECT_EQ(fault_hits("a"), 3);
  set_faults("");
  EXPECT_EQ(fault_point("a"), 0);
  EXPECT_EQ(fault_hits("a"), 0);  // disarmed: not counted
}

}  // namespace
}  // namespace zerod
