// Crashes and concurrency through the real binaries: `zerod train` (two local ranks) SIGKILLed at
// random points of a save (core/fault_points.h picks the arrival) resumes exactly; two runs on one
// checkpoint directory cannot destroy each other's checkpoints; a daemon killed in the middle of a
// save comes back, reports its job interrupted, and resumes it from the newest complete one.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>

#include "../e2e/process_util.h"
#include "engine/checkpoint/checkpoint_dir.h"
#include "engine/checkpoint/manifest.h"

namespace zerod {
namespace {

namespace fs = std::filesystem;
using testing::Process;
using testing::zeroctl_binary;
using testing::zerod_binary;
using namespace std::chrono_literals;

class Crashes : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::make_test_dir("zerod_faults", "a crash must not lose a checkpoint. ");
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write_job(int64_t steps, int save_interval, const std::string& name = "job.json") {
    std::ofstream(dir_ / name) << R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
      "zero_optimization": {"stage": 2}, "steps_per_print": 1,
      "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 256, "seq_len": 16},
      "data": {"train": "data/c_train_*.bin"},
      "train": {"steps": )" << steps
                               << R"(, "checkpoint_dir": "ckpt", "save_interval": )"
                               << save_interval << "}}";
  }
  // Runs `zerod ARGS` to its end (120 s at most) with `env` added: exit code and output.
  std::pair<int, std::string> run(const std::vector<std::string>& args, const std::string& env = "",
                                  const std::string& binary = zerod_binary()) {
    auto p = testing::start_in(dir_, args, "run" + std::to_string(runs_++) + ".log", env, binary);
    const int rc = p->wait_for(120s);
    return {rc, p->output()};
  }
  fs::path ckpt() const { return dir_ / "ckpt"; }

  // `latest` names a complete checkpoint: its manifest reads and every file it lists has the
  // size recorded there. Returns its step.
  int64_t check_latest_complete(const std::string& what) {
    const auto latest = read_latest(ckpt().string());
    EXPECT_TRUE(latest.has_value()) << what;
    if (!latest) return -1;
    const Manifest m = read_manifest((ckpt() / *latest).string());
    EXPECT_FALSE(m.files.empty()) << what;
    for (const CheckpointFile& f : m.files) {
      EXPECT_EQ(static_cast<int64_t>(fs::file_size(ckpt() / *latest / f.name)), f.bytes)
          << what << ": " << *latest << "/" << f.name;
    }
    return m.progress.global_step;
  }

  fs::path dir_;
  int runs_ = 0;
};

// The arrivals at each fault point one process made, from the line ZEROD_FAULTS=count prints.
std::map<std::string, int> reported_hits(const std::string& out) {
  std::map<std::string, int> hits;
  std::smatch line;
  if (!std::regex_search(out, line, std::regex("zerod fault points \\(pid [0-9]+\\):([^\n]*)")))
    return hits;
  const std::string rest = line[1];
  const std::regex kv("([a-z_.]+)=([0-9]+)");
  for (auto it = std::sregex_iterator(rest.begin(), rest.end(), kv); it != std::sregex_iterator();
       ++it)
    hits[(*it)[1]] = std::stoi((*it)[2]);
  return hits;
}

TEST_F(Crashes, KillNineAtRandomPointsOfASaveLosesNothingAndResumesExactly) {
  constexpr int kSteps = 8, kInterval = 3;  // saves at steps 3, 6 and 8
  // How often one save reaches each point (both ranks of the process together).
  write_job(kInterval, kInterval);
  auto [rc, out] = run({"train", "job.json", "--nproc-per-node", "2"}, "ZEROD_FAULTS=count");
  ASSERT_EQ(rc, 0) << out;
  const std::map<std::string, int> per_save = reported_hits(out);
  ASSERT_EQ(per_save.size(), 4u) << out;  // write, fsync, rename, rank_file
  fs::remove_all(ckpt());
  write_job(kSteps, kInterval);
  auto [whole_rc, whole] = run({"train", "job.json", "--nproc-per-node", "2"});
  ASSERT_EQ(whole_rc, 0) << whole;
  fs::remove_all(ckpt());

  // ZEROD_FAULT_SEED=N replays a failure's trials.
  const char* given = std::getenv("ZEROD_FAULT_SEED");
  const unsigned seed = given != nullptr ? std::stoul(given) : std::random_device{}();
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 3; ++trial) {
    // A point, and an arrival in the second save (global_step6).
    auto it = per_save.begin();
    std::advance(it, std::uniform_int_distribution<int>(0, per_save.size() - 1)(rng));
    const int at = it->second + std::uniform_int_distribution<int>(1, it->second)(rng);
    const std::string spec = it->first + "@" + std::to_string(at) + "=kill";
    const std::string trace = "ZEROD_FAULT_SEED=" + std::to_string(seed) + " trial " +
                              std::to_string(trial) + ": ZEROD_FAULTS=" + spec;
    std::printf("%s\n", trace.c_str());
    SCOPED_TRACE(trace);
    fs::remove_all(ckpt());
    auto [killed_rc, killed] =
        run({"train", "job.json", "--nproc-per-node", "2"}, "ZEROD_FAULTS=" + spec);
    ASSERT_EQ(killed_rc, -9) << killed;
    const int64_t from = check_latest_complete(spec);
    EXPECT_TRUE(from == 3 || from == 6) << from;
    auto [resumed_rc, resumed] =
        run({"train", "job.json", "--nproc-per-node", "2", "--resume", "latest"});
    ASSERT_EQ(resumed_rc, 0) << resumed;
    EXPECT_NE(resumed.find("resumed from ckpt/global_step" + std::to_string(from)),
              std::string::npos)
        << resumed;
    for (int s = static_cast<int>(from) + 1; s <= kSteps; ++s) {
      EXPECT_GT(testing::printed_loss(resumed, s), 0) << resumed;
      EXPECT_EQ(testing::printed_loss(resumed, s), testing::printed_loss(whole, s)) << "step " << s;
    }
    EXPECT_EQ(check_latest_complete(spec + ", resumed"), kSteps);
    for (const auto& e : fs::directory_iterator(ckpt())) {  // the save after the resume cleaned
      EXPECT_NE(e.path().extension(), ".tmp") << e.path() << " was left behind";
      EXPECT_NE(e.path().extension(), ".old") << e.path() << " was left behind";
    }
  }
}

// Two runs on one checkpoint directory: the second is refused at once naming the first (exit 2),
// the first is untouched and its checkpoints complete; once the first is killed, its stale lock
// does not stop the next run, which resumes from what the first saved.
TEST_F(Crashes, TwoRunsOnOneCheckpointDirectoryCannotDestroyEachOther) {
  write_job(1000000, 2);
  auto first = testing::start_in(dir_, {"train", "job.json"}, "first.log");
  ASSERT_TRUE(first->wait_output("checkpoint global_step4 saved", 60s)) << first->output();
  auto [rc, out] = run({"train", "job.json", "--steps", "3"});
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("is in use by another zerod job"), std::string::npos) << out;
  EXPECT_NE(out.find("pid " + std::to_string(first->pid())), std::string::npos) << out;
  ASSERT_TRUE(first->wait_output("checkpoint global_step8 saved", 60s)) << first->output();
  const int64_t step = check_latest_complete("after the refused second run");
  EXPECT_GE(step, 8);
  // Killed: the lock's holder is gone, and the next run takes over and continues.
  first->kill9();
  first->wait_for(30s);
  const int64_t saved = check_latest_complete("after the kill");
  auto [next_rc, next] =
      run({"train", "job.json", "--resume", "latest", "--steps", std::to_string(saved + 2)});
  EXPECT_EQ(next_rc, 0) << next;
  EXPECT_NE(next.find("resumed from ckpt/global_step" + std::to_string(saved)), std::string::npos)
      << next;
  EXPECT_EQ(check_latest_complete("after the next run"), saved + 2);
}

#ifdef ZEROD_HAVE_GRPC
// `zerod serve` SIGKILLed between a save's files and its commit (the job runs in the daemon):
// restarted on the same state directory it reports the job interrupted at the newest complete
// checkpoint, and `zeroctl resume` finishes it from there.
TEST_F(Crashes, ADaemonKilledInTheMiddleOfASaveResumesItsJobFromTheNewestCompleteCheckpoint) {
  write_job(12, 4);
  const std::string sock = "unix:" + (dir_ / "d.sock").string();
  const std::string state = (dir_ / "state").string();
  auto start_daemon = [&](const std::string& env, const std::string& log) {
    auto d = testing::start_in(dir_, {"serve", "--listen", sock, "--state-dir", state}, log, env);
    EXPECT_TRUE(d->wait_output("listening on ", 30s)) << d->output();
    return d;
  };
  auto ctl = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {"--addr", sock});
    return run(args, "", zeroctl_binary());
  };
  // The second save's first rename (TAG.tmp -> TAG; each save makes two) kills the daemon.
  auto daemon = start_daemon("ZEROD_FAULTS=save.rename@3=kill", "daemon0.log");
  auto [submit_rc, submitted] = ctl({"submit", "job.json"});
  ASSERT_EQ(submit_rc, 0) << submitted;
  EXPECT_EQ(daemon->wait_for(60s), -9) << daemon->output();
  EXPECT_TRUE(fs::exists(ckpt() / "global_step8.tmp"));
  EXPECT_EQ(check_latest_complete("after the kill"), 4);

  daemon = start_daemon("", "daemon1.log");
  auto [status_rc, status] = ctl({"status"});
  EXPECT_EQ(status_rc, 0) << status;
  EXPECT_NE(status.find("job-1 interrupted"), std::string::npos) << status;
  EXPECT_NE(status.find("from checkpoint global_step4"), std::string::npos) << status;
  auto [resume_rc, resumed] = ctl({"resume"});
  ASSERT_EQ(resume_rc, 0) << resumed;
  auto [watch_rc, watched] = ctl({"status", "--watch"});
  EXPECT_EQ(watch_rc, 0) << watched;
  EXPECT_NE(watched.find("job-2 finished | step 12/12"), std::string::npos) << watched;
  // (A submitted job's paths are absolute: resolved against the job file's directory.)
  EXPECT_NE(daemon->output().find("ckpt/global_step4 (step 4"), std::string::npos)
      << daemon->output();
  EXPECT_NE(daemon->output().find("resumed from "), std::string::npos) << daemon->output();
  EXPECT_EQ(check_latest_complete("after the resume"), 12);
  EXPECT_FALSE(fs::exists(ckpt() / "global_step8.tmp"));
}
#endif

}  // namespace
}  // namespace zerod
