// Hostile and careless input through the binaries: a job file nested 100,000 levels deep is a
// clear exit 2 for zerod check / train and INVALID_ARGUMENT from the daemon (which stays up), as
// are a 10 KB tag and a job with thousands of problems (never RESOURCE_EXHAUSTED on the status);
// a batch size that does not fit is refused; a resume with nothing left to train says so; and
// Ctrl-C (SIGINT) saves at the next step boundary like SIGTERM, a second one exiting at once.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
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

class Reliability : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::make_test_dir("zerod_reliability", "careless input must not hurt. ");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A small job (steps, checkpoint_dir "ckpt" with `save_interval` unless `checkpoint` is false).
  void write_job(const std::string& name, int64_t steps, bool checkpoint = true,
                 int save_interval = 0,
                 const std::string& model = R"("n_layer": 1, "n_head": 2, "n_embd": 16,
                                               "vocab_size": 256, "seq_len": 16)",
                 int micro_batch = 4) {
    std::ofstream(dir_ / name) << R"({"train_batch_size": )" << 2 * micro_batch
                               << R"(, "train_micro_batch_size_per_gpu": )" << micro_batch << R"(,
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
      "zero_optimization": {"stage": 1}, "steps_per_print": 1,
      "model": {)" << model << R"(},
      "data": {"train": "data/c_train_*.bin"},
      "train": {"steps": )" << steps
                               << (checkpoint ? R"(, "checkpoint_dir": "ckpt", "save_interval": )" +
                                                    std::to_string(save_interval)
                                              : std::string())
                               << "}}";
  }
  std::unique_ptr<Process> start(const std::vector<std::string>& args, const std::string& log,
                                 const std::string& binary = zerod_binary()) {
    return testing::start_in(dir_, args, log, "", binary);
  }
  // Runs to the end (60 s at most): exit code and output.
  std::pair<int, std::string> run(const std::vector<std::string>& args,
                                  const std::string& binary = zerod_binary()) {
    auto p = start(args, "run" + std::to_string(runs_++) + ".log", binary);
    const int rc = p->wait_for(60s);
    return {rc, p->output()};
  }

  fs::path dir_;
  int runs_ = 0;
};

TEST_F(Reliability, DeeplyNestedJobFilesAreExit2NotACrash) {
  std::ofstream(dir_ / "deep.json") << std::string(100000, '[') << std::string(100000, ']');
  for (const char* cmd : {"check", "train"}) {
    const auto [rc, out] = run({cmd, "deep.json"});
    EXPECT_EQ(rc, 2) << cmd << ": " << out.substr(0, 2000);
    EXPECT_NE(out.find("deep.json: JSON nests 100000 levels deep"), std::string::npos)
        << out.substr(0, 2000);
    EXPECT_NE(out.find("at most 64 are allowed"), std::string::npos) << out.substr(0, 2000);
    EXPECT_LT(out.size(), 2000u) << out.substr(0, 2000);
  }
}

TEST_F(Reliability, BatchSizesThatDoNotFitAreExit2NamingTheKey) {
  // Only the micro-batch: train_batch_size derives from it (and was trained as micro-batch 0).
  std::ofstream(dir_ / "huge.json") << R"({"train_micro_batch_size_per_gpu": 1099511627776,
      "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 256, "seq_len": 16},
      "data": {"train": "data/c_train_*.bin"}, "train": {"steps": 2}})";
  for (const char* cmd : {"check", "train"}) {
    const auto [rc, out] = run({cmd, "huge.json"});
    EXPECT_EQ(rc, 2) << cmd << ": " << out;
    EXPECT_NE(out.find("train_micro_batch_size_per_gpu: 1099511627776 is out of range"),
              std::string::npos)
        << out;
    EXPECT_EQ(out.find("micro_batch 0"), std::string::npos) << out;
  }
}

TEST_F(Reliability, AResumeWithNothingLeftToTrainSaysSoAndWhatToPass) {
  write_job("job.json", 3, /*checkpoint=*/true, /*save_interval=*/3);
  auto [rc, out] = run({"train", "job.json"});
  ASSERT_EQ(rc, 0) << out;
  ASSERT_EQ(read_latest((dir_ / "ckpt").string()).value_or(""), "global_step3") << out;
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"train", "job.json", "--resume", "latest"},
        std::vector<std::string>{"train", "job.json", "--resume", "auto", "--steps", "2"}}) {
    std::tie(rc, out) = run(args);
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("nothing to train"), std::string::npos) << out;
    EXPECT_NE(out.find("--steps"), std::string::npos) << out;
    EXPECT_NE(out.find("train.steps"), std::string::npos) << out;
  }
  // With more steps it continues.
  std::tie(rc, out) = run({"train", "job.json", "--resume", "latest", "--steps", "4"});
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("step 4/4"), std::string::npos) << out;
  EXPECT_EQ(out.find("nothing to train"), std::string::npos) << out;
}

TEST_F(Reliability, SigintSavesAtTheNextStepBoundaryLikeSigterm) {
  write_job("job.json", 1000000);
  auto p = start({"train", "job.json", "--nproc-per-node", "2"}, "int.log");
  ASSERT_TRUE(p->wait_output("5/1000000 | loss", 60s)) << p->output();
  ::kill(p->pid(), SIGINT);
  ASSERT_EQ(p->wait_for(60s), 0) << p->output();
  const std::string out = p->output();
  EXPECT_NE(out.find("interrupt (SIGINT): stopping at the next step boundary"), std::string::npos)
      << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      out, m, std::regex("checkpoint (global_step([0-9]+)) saved at step ([0-9]+)")))
      << out;
  const int step = std::stoi(m[3]);
  EXPECT_GE(step, 5);
  EXPECT_EQ(read_latest((dir_ / "ckpt").string()).value_or(""), m[1].str());
  EXPECT_EQ(read_manifest((dir_ / "ckpt" / m[1].str()).string()).progress.global_step, step);
}

TEST_F(Reliability, ASecondSigintExitsAtOnce) {
  // Steps of about 2 s on two cores, so the second Ctrl-C lands inside one.
  write_job("slow.json", 1000000, /*checkpoint=*/false, /*save_interval=*/0,
            R"("n_layer": 4, "n_head": 4, "n_embd": 384, "vocab_size": 256, "seq_len": 256)",
            /*micro_batch=*/8);
  auto p = start({"train", "slow.json"}, "twice.log");
  ASSERT_TRUE(p->wait_output("1/1000000 | loss", 120s)) << p->output();
  ::kill(p->pid(), SIGINT);
  ASSERT_TRUE(p->wait_output("press Ctrl-C again to exit at once", 10s)) << p->output();
  ::kill(p->pid(), SIGINT);
  EXPECT_EQ(p->wait_for(30s), 130) << p->output();
  EXPECT_NE(p->output().find("second stop signal: exiting at once"), std::string::npos)
      << p->output();
}

#ifdef ZEROD_HAVE_GRPC
TEST_F(Reliability, TheDaemonAnswersInvalidArgumentToHostileRequestsAndStaysUp) {
  const std::string addr = "unix:" + (dir_ / "d.sock").string();
  Process d({zerod_binary(), "serve", "--listen", addr, "--state-dir", (dir_ / "state").string()},
            dir_.string(), (dir_ / "daemon.log").string());
  ASSERT_TRUE(d.wait_output("listening on " + addr, 30s)) << d.output();
  auto ctl = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {"--addr", addr});
    return run(args, zeroctl_binary());
  };

  // A 10 KB tag: the message quotes a prefix and the length.
  write_job("job.json", 2);
  auto [rc, out] = ctl({"submit", "job.json", "--resume", std::string(10240, 't')});
  EXPECT_EQ(rc, 2) << out.substr(0, 2000);
  EXPECT_NE(out.find("INVALID_ARGUMENT"), std::string::npos) << out.substr(0, 2000);
  EXPECT_NE(out.find("(10240 bytes)"), std::string::npos) << out.substr(0, 2000);
  EXPECT_LT(out.size(), 2000u) << out.substr(0, 2000);

  // Thousands of problems, each naming a long key: still INVALID_ARGUMENT, the list cut short.
  std::string many = R"({"train_micro_batch_size_per_gpu": 2, "train": {"steps": 2})";
  for (int i = 0; i < 3000; ++i) {
    many += ", \"unknown_" + std::to_string(i) + std::string(100, 'k') + "\": 1";
  }
  std::ofstream(dir_ / "many.json") << many << "}";
  std::tie(rc, out) = ctl({"submit", "many.json"});
  EXPECT_EQ(rc, 2) << out.substr(0, 2000);
  EXPECT_NE(out.find("INVALID_ARGUMENT"), std::string::npos) << out.substr(0, 2000);
  EXPECT_EQ(out.find("RESOURCE_EXHAUSTED"), std::string::npos) << out.substr(0, 2000);
  EXPECT_NE(out.find("unknown key"), std::string::npos) << out.substr(0, 2000);

  // 100,000 nested arrays (this killed the daemon).
  std::ofstream(dir_ / "deep.json") << std::string(100000, '[') << std::string(100000, ']');
  std::tie(rc, out) = ctl({"submit", "deep.json"});
  EXPECT_EQ(rc, 2) << out.substr(0, 2000);
  EXPECT_NE(out.find("INVALID_ARGUMENT"), std::string::npos) << out.substr(0, 2000);
  EXPECT_NE(out.find("JSON nests 100000 levels deep"), std::string::npos) << out.substr(0, 2000);

  // Still serving: a good job runs to the end.
  std::tie(rc, out) = ctl({"submit", "job.json"});
  EXPECT_EQ(rc, 0) << out;
  std::tie(rc, out) = ctl({"status", "--watch"});
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("finished"), std::string::npos) << out;
}
#endif

}  // namespace
}  // namespace zerod
