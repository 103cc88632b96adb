// The zerod binary end to end: a real training run, `zerod check`, and bad input of every kind
// ending with exit code 2 and one clear message (never a crash or a hang: every run is bounded
// by `timeout`).
#include <gtest/gtest.h>
#include <pty.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "engine/data/corpus.h"
#include "engine/data/shard.h"
#include "run_command.h"

namespace zerod {
namespace {

namespace fs = std::filesystem;

using testing::RunResult;

RunResult run(const std::string& args, const fs::path& cwd,
              const std::string& binary = std::string(ZEROD_BINARY_DIR) + "/engine/zerod") {
  return testing::run_in(cwd, binary, args);
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("zerod_cli_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::string text;
    while (text.size() < 40000) text += "hello zerod, train me on bytes please. ";
    write_text_shards({reinterpret_cast<const uint8_t*>(text.data()), text.size()},
                      (dir_ / "data").string(), 0.1, 1 << 20, "t");
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write(const std::string& name, const std::string& content) {
    std::ofstream(dir_ / name) << content;
  }
  static std::string job(const std::string& data_train = "data/t_train_*.bin",
                         const std::string& extra = "") {
    return R"({"train_micro_batch_size_per_gpu": 4,
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
      "steps_per_print": 5,
      "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 256, "seq_len": 16},
      "data": {"train": ")" +
           data_train + R"(", "val": "data/t_val_*.bin"},
      "train": {"steps": 10, "eval_interval": 5, "eval_batches": 2})" +
           extra + "}";
  }

  fs::path dir_;
};

TEST_F(Cli, TrainsAJobAndWritesItsMetrics) {
  write("job.json",
        job("data/t_train_*.bin",
            R"(, "csv_monitor": {"enabled": true, "output_path": "runs", "job_name": "j"})"));
  const RunResult r = run("train job.json", dir_);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("step 10/10"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("val "), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(dir_ / "runs" / "j" / "metrics.csv"));
  EXPECT_NE(r.output.find("metrics: runs/j/metrics.csv (csv_monitor)"), std::string::npos)
      << r.output;
  // Running the job again never truncates the first run's metrics: the new run gets
  // runs/j_1/, and says so.
  std::ifstream first_in(dir_ / "runs" / "j" / "metrics.csv");
  const std::string first((std::istreambuf_iterator<char>(first_in)), {});
  const RunResult again = run("train job.json --steps 3", dir_);
  ASSERT_EQ(again.code, 0) << again.output;
  EXPECT_NE(again.output.find("metrics: runs/j_1/metrics.csv (csv_monitor, a new run directory: "
                              "runs/j holds an earlier run's)"),
            std::string::npos)
      << again.output;
  std::ifstream first_after(dir_ / "runs" / "j" / "metrics.csv");
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(first_after)), {}), first);
  std::ifstream second(dir_ / "runs" / "j_1" / "metrics.csv");
  int lines = 0;
  for (std::string line; std::getline(second, line);) ++lines;
  EXPECT_EQ(lines, 4);  // header + 3 steps
  // Into a pipe (as into a log file) no live progress line: no carriage return, no erasing.
  EXPECT_EQ(r.output.find('\r'), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("\033[K"), std::string::npos) << r.output;
}

// Document masking on packed byte-level text (every space ends a document, so a 17-token
// sample holds several), on two local ranks (data parallelism) with validation; and tensor
// parallelism with sequence parallelism on two ranks.
TEST_F(Cli, TrainsWithDocumentMasking) {
  const std::string masking = R"(, "document_masking": true, "eos_token_id": 32)";
  std::string j = job();
  j.replace(j.find(R"("val": "data/t_val_*.bin")"), 0, masking.substr(2) + ", ");
  write("job.json", j);
  const RunResult r = run("train job.json --nproc-per-node 2", dir_);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("step 10/10"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("val "), std::string::npos) << r.output;
  std::string tp =
      job("data/t_train_*.bin", R"(, "parallelism": {"tensor": 2, "sequence_parallel": true})");
  tp.replace(tp.find(R"("val": "data/t_val_*.bin")"), 0, masking.substr(2) + ", ");
  write("tp.json", tp);
  const RunResult t = run("train tp.json --nproc-per-node 2 --steps 3", dir_);
  ASSERT_EQ(t.code, 0) << t.output;
  EXPECT_NE(t.output.find("step 3/3"), std::string::npos) << t.output;
}

// On a terminal (a pseudo-terminal here) the run draws a live progress line between its log
// lines: a bar, the step, the loss and the ETA, redrawn in place; the log lines stay whole.
TEST_F(Cli, ATerminalShowsALiveProgressLine) {
  write("job.json", job("data/t_train_*.bin", ""));
  int master = -1;
  const pid_t pid = ::forkpty(&master, nullptr, nullptr, nullptr);
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::chdir(dir_.c_str()) != 0) ::_exit(127);
    ::setenv("TERM", "xterm", 1);
    const std::string zerod = std::string(ZEROD_BINARY_DIR) + "/engine/zerod";
    ::execl(zerod.c_str(), zerod.c_str(), "train", "job.json", "--steps", "30", nullptr);
    ::_exit(127);
  }
  std::string out;
  char buf[4096];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline) {
    const ssize_t n = ::read(master, buf, sizeof(buf));
    if (n <= 0) break;  // EIO once the child has exited and closed the terminal
    out.append(buf, static_cast<size_t>(n));
  }
  int status = 0;
  ::kill(pid, SIGKILL);  // (already gone unless the deadline passed)
  ::waitpid(pid, &status, 0);
  ::close(master);
  EXPECT_NE(out.find("done: 30 steps"), std::string::npos) << out;
  EXPECT_NE(out.find("\r\033[K[####################] step 30/30 | loss "), std::string::npos)
      << out;
  EXPECT_NE(out.find("| ETA "), std::string::npos) << out;
  // Every log line starts on a line of its own as the terminal shows it: after a newline, or
  // after the progress line was erased (carriage return, erase to the end of the line).
  for (size_t at = out.find("info "); at != std::string::npos; at = out.find("info ", at + 1)) {
    const size_t newline = out.rfind('\n', at);
    const size_t erased = out.rfind("\r\033[K", at);
    size_t start = newline == std::string::npos ? 0 : newline + 1;
    if (erased != std::string::npos && erased + 4 > start) start = erased + 4;
    const std::string prefix = out.substr(start, at - start);
    EXPECT_EQ(prefix.find("step "), std::string::npos) << "a log line after progress: " << prefix;
  }
}

TEST_F(Cli, TheBuiltInDemoTrainsOnTheEmbeddedCorpus) {
  const RunResult r = run("train --steps 30 --demo-dir demo", dir_);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("built-in demo job"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step 30/30"), std::string::npos) << r.output;
  // Shards of the project's own text were written and read back.
  EXPECT_TRUE(fs::exists(dir_ / "demo" / "data" / "demo_train_000000.bin"));
  EXPECT_GT(fs::file_size(dir_ / "demo" / "data" / "demo_train_000000.bin"), size_t{100000});
  // The loss falls from ln(256) = 5.55 within 30 steps (the summary line: "loss A -> B").
  const auto at = r.output.find("; loss ");
  ASSERT_NE(at, std::string::npos) << r.output;
  double first = 0, last = 0;
  ASSERT_EQ(std::sscanf(r.output.c_str() + at, "; loss %lf -> %lf", &first, &last), 2) << r.output;
  EXPECT_NEAR(first, 5.55, 0.3);
  EXPECT_LT(last, first - 1.0);
  std::ifstream csv(dir_ / "demo" / "runs" / "demo" / "metrics.csv");
  int lines = 0;
  for (std::string line; std::getline(csv, line);) ++lines;
  EXPECT_EQ(lines, 31);  // header + one row per step
}

TEST_F(Cli, CheckPrintsTheResolvedConfig) {
  write("job.json", job());
  const RunResult r = run("check job.json --world-size 2", dir_);
  ASSERT_EQ(r.code, 0) << r.output;
  // Derived values are present: the batch triangle for world 2 and the padded vocabulary.
  EXPECT_NE(r.output.find("\"train_batch_size\": 8"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"gradient_accumulation_steps\": 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"padded_vocab_size\": 256"), std::string::npos) << r.output;
}

// A pipeline job: `zerod check` prints each stage's layers and parameters, each rank's model
// states, and the schedule's simulated bubble; `zerod train` runs it as two processes on
// loopback, one stage each, and ends at the loss of the same job on one process; so do the
// zero-bubble schedule and interleaved 1F1B with two chunks per rank.
TEST_F(Cli, CheckPrintsThePipelinePlanAndTrainRunsIt) {
  const std::string p = R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4,
      "model": {"n_layer": 4, "n_head": 2, "n_embd": 16, "vocab_size": 256, "seq_len": 16},
      "parallelism": {"pipeline": 2, "pipeline_schedule": "1f1b"},
      "data": {"train": "data/t_train_*.bin"}, "train": {"steps": 2}})";
  write("p.json", p);
  const RunResult r = run("check p.json --world-size 2", dir_);
  ASSERT_EQ(r.code, 0) << r.output;
  // (P - 1) / (M + P - 1) = 1 / 5 with F = 1, B = 2.
  EXPECT_NE(r.output.find("schedule 1f1b, 4 micro-batches per step: simulated bubble 0.2000"),
            std::string::npos)
      << r.output;
  // 16-wide blocks of 3280 parameters; wte 256 x 16 + wpe 16 x 16 = 4352; ln_f 32 and the tied
  // head's copy of wte 4096.
  EXPECT_NE(r.output.find("stage 0 (rank 0, chunk 0): layers 0-1 (2) + embedding, 10912 "
                          "parameters"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("stage 1 (rank 1, chunk 0): layers 2-3 (2) + final norm and head, "
                          "10688 parameters"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("at most 2 micro-batch activations live"), std::string::npos) << r.output;
  // Each rank's activations: its stage model's allocation for its live micro-batches (the
  // formula is checked against the allocation in zerod_test_parallel); the first stage holds two
  // micro-batches of two layers, the last one of two layers and the logits.
  EXPECT_NE(r.output.find("optimizer), activations "), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("activations not included"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"pipeline\": [\n"), std::string::npos) << r.output;  // the layout
  // The last step's loss ("step 2/2 | loss X |") of a run's output.
  auto last_loss = [](const std::string& out) {
    const auto at = out.find("step 2/2 | loss ");
    double loss = -1;
    if (at != std::string::npos) std::sscanf(out.c_str() + at, "step 2/2 | loss %lf", &loss);
    return loss;
  };
  const RunResult t = run("train p.json --nproc-per-node 2", dir_);
  ASSERT_EQ(t.code, 0) << t.output;
  std::string one = p;
  one.replace(one.find(R"("pipeline": 2)"), 13, R"("pipeline": 1)");
  write("one.json", one);
  const RunResult o = run("train one.json", dir_);
  ASSERT_EQ(o.code, 0) << o.output;
  ASSERT_GT(last_loss(o.output), 0) << o.output;
  EXPECT_NEAR(last_loss(t.output), last_loss(o.output), 1e-5 * last_loss(o.output)) << t.output;
  std::string zb = p;
  zb.replace(zb.find("1f1b"), 4, "zero_bubble");
  write("zb.json", zb);
  const RunResult z = run("train zb.json --nproc-per-node 2", dir_);
  ASSERT_EQ(z.code, 0) << z.output;
  EXPECT_NEAR(last_loss(z.output), last_loss(o.output), 1e-5 * last_loss(o.output)) << z.output;
  std::string il = p;
  il.replace(il.find("\"1f1b\""), 6, R"("interleaved_1f1b", "virtual_stages": 2)");
  write("il.json", il);
  const RunResult i = run("train il.json --nproc-per-node 2", dir_);
  ASSERT_EQ(i.code, 0) << i.output;
  EXPECT_NEAR(last_loss(i.output), last_loss(o.output), 1e-5 * last_loss(o.output)) << i.output;
  // Four processes: two stages of two context ranks each (ring attention), the same loss.
  std::string cp = p;
  cp.replace(cp.find(R"("pipeline": 2)"), 13,
             R"("pipeline": 2, "context": 2, "context_impl": "ring")");
  write("cp.json", cp);
  const RunResult c = run("train cp.json --nproc-per-node 4", dir_);
  ASSERT_EQ(c.code, 0) << c.output;
  EXPECT_NE(c.output.find("context 2"), std::string::npos) << c.output;
  EXPECT_NEAR(last_loss(c.output), last_loss(o.output), 1e-5 * last_loss(o.output)) << c.output;
}

// An elastic job: `zerod check` prints the valid world sizes and each one's batch triangle; the
// run takes its batch for the world it runs at, and a world outside the set is refused.
TEST_F(Cli, ElasticityPicksTheBatchForTheWorldSize) {
  // [2, 4] within 8 on 1-4 ranks: 8 trains on 1, 2, 4 (8 / 3 is no multiple of 2 or 4).
  const std::string elastic = R"("elasticity": {"enabled": true, "max_train_batch_size": 8,
      "micro_batch_sizes": [2, 4], "min_gpus": 1, "max_gpus": 4, "version": 0.1})";
  const std::string body = R"(
      "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 256, "seq_len": 16},
      "data": {"train": "data/t_train_*.bin", "val": "data/t_val_*.bin"},
      "train": {"steps": 2}})";
  write("e.json", "{" + elastic + "," + body);
  const RunResult r = run("check e.json --world-size 2", dir_);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("elasticity (version 0.1): train_batch_size 8 on 3 valid world sizes"),
            std::string::npos)
      << r.output;
  // world size, data-parallel, micro-batch, accumulation, global batch
  EXPECT_NE(r.output.find("           1              1            4             2             8\n"
                          "           2              2            4             1             8\n"
                          "           4              4            2             1             8\n"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("\"train_micro_batch_size_per_gpu\": 4"), std::string::npos) << r.output;
  const RunResult bad = run("check e.json --world-size 3", dir_);
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_NE(bad.output.find("world size 3 is not valid for elasticity (version 0.1, "
                            "train_batch_size 8): the valid world sizes are 1, 2, 4"),
            std::string::npos)
      << bad.output;
  const RunResult t3 = run("train e.json --nproc-per-node 3", dir_);
  EXPECT_EQ(t3.code, 2) << t3.output;
  EXPECT_NE(t3.output.find("world size 3 is not valid for elasticity"), std::string::npos)
      << t3.output;
  // The resource scheduler saw another section (DeepSpeed's DEEPSPEED_ELASTICITY_CONFIG).
  const RunResult s = run("train e.json", dir_,
                          R"(env DEEPSPEED_ELASTICITY_CONFIG='{"enabled": true, )"
                          R"("max_train_batch_size": 16, "micro_batch_sizes": [2, 4], )"
                          R"("version": 0.1}' )" +
                              std::string(ZEROD_BINARY_DIR) + "/engine/zerod");
  EXPECT_EQ(s.code, 2) << s.output;
  EXPECT_NE(s.output.find("DEEPSPEED_ELASTICITY_CONFIG: the resource scheduler's elasticity "
                          "section has max_train_batch_size 16 (the job's: 8)"),
            std::string::npos)
      << s.output;
  // One rank: micro-batch 4 x accumulation 2.
  const RunResult t = run("train e.json", dir_);
  ASSERT_EQ(t.code, 0) << t.output;
  EXPECT_NE(t.output.find("elasticity v0.1: world size 1 -> micro-batch 4 x accumulation 2 x "
                          "data-parallel 1 = train_batch_size 8"),
            std::string::npos)
      << t.output;
  EXPECT_NE(t.output.find("step 2/2"), std::string::npos) << t.output;
  // One process evaluates, also when 1 is not among the world sizes (min_gpus 2).
  std::string two = elastic;
  two.replace(two.find("\"min_gpus\": 1"), 13, "\"min_gpus\": 2");
  write("e2.json", "{" + two + "," + body);
  EXPECT_EQ(run("check e2.json --world-size 1", dir_).code, 2);
  const RunResult ev = run("eval e2.json --sample-tokens 0", dir_);
  EXPECT_EQ(ev.code, 0) << ev.output;
  // DeepSpeed's rule: batch keys beside an enabled section are refused.
  write("k.json", R"({"train_batch_size": 8,)" + elastic + "," + body);
  const RunResult k = run("check k.json", dir_);
  EXPECT_EQ(k.code, 2) << k.output;
  EXPECT_NE(k.output.find("train_batch_size: 8 is set with elasticity.enabled"), std::string::npos)
      << k.output;
}

// "step,loss" of each row of a csv_monitor's metrics.csv.
std::vector<std::string> csv_losses(const fs::path& file) {
  std::ifstream in(file);
  std::vector<std::string> out;
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) out.push_back(line.substr(0, line.find(',', line.find(',') + 1)));
  return out;
}

// An elastic job trains what the plain job with its triangle written out trains (bit for bit),
// resumes on another world size of its list with the same global batch, and a version-0.2
// world outside the list (a batch of its own) is refused on resume like any batch change.
TEST_F(Cli, AnElasticJobTrainsItsTriangleAndKeepsItsBatchAcrossWorldSizes) {
  // v0.2 on nodes of one rank: 8 on 1, 2, 4 ranks (as v0.1); 3 ranks get 6 = 3 x micro 2.
  const std::string elastic = R"("elasticity": {"enabled": true, "max_train_batch_size": 8,
      "micro_batch_sizes": [2, 4], "min_gpus": 1, "max_gpus": 4, "version": 0.2})";
  auto job = [](const std::string& batch, const std::string& name) {
    return "{" + batch + R"(,
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
      "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 256, "seq_len": 16},
      "data": {"train": "data/t_train_*.bin"},
      "csv_monitor": {"enabled": true, "output_path": "runs", "job_name": ")" +
           name + R"("},
      "train": {"steps": 4, "checkpoint_dir": "ck_)" +
           name + R"(", "save_interval": 2}})";
  };
  write("e.json", job(elastic, "e"));
  write("p.json", job(R"("train_batch_size": 8, "train_micro_batch_size_per_gpu": 4)", "p"));
  const RunResult e = run("train e.json --nproc-per-node 2", dir_);
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_NE(e.output.find("world size 2 -> micro-batch 4 x accumulation 1 x data-parallel 2"),
            std::string::npos)
      << e.output;
  const RunResult p = run("train p.json --nproc-per-node 2", dir_);
  ASSERT_EQ(p.code, 0) << p.output;
  const auto losses = csv_losses(dir_ / "runs" / "e" / "metrics.csv");
  EXPECT_EQ(losses.size(), 4u);
  EXPECT_EQ(losses, csv_losses(dir_ / "runs" / "p" / "metrics.csv"));
  // One rank: the same 8 sequences per step as accumulation 2, no batch change.
  const RunResult one = run("train e.json --resume global_step2", dir_);
  ASSERT_EQ(one.code, 0) << one.output;
  EXPECT_NE(one.output.find("batch on resume: the checkpoint trained 8 sequences/step = "
                            "micro-batch 4 x accumulation 1 x data-parallel 2; this run trains 8 "
                            "sequences/step = micro-batch 4 x accumulation 2 x data-parallel 1"),
            std::string::npos)
      << one.output;
  // Three ranks: version 0.2's own batch 6 = micro 2 x 1 x 3, another global batch: refused.
  const RunResult three = run("train e.json --nproc-per-node 3 --resume global_step2", dir_);
  EXPECT_EQ(three.code, 2) << three.output;
  EXPECT_NE(three.output.find("was trained with a global batch of 8 sequences/step"),
            std::string::npos)
      << three.output;
  EXPECT_NE(three.output.find("this job's is 6 sequences/step = micro-batch 2 x accumulation 1 x "
                              "data-parallel 3"),
            std::string::npos)
      << three.output;
}

TEST_F(Cli, ExampleConfigsAreValid) {
  for (const char* name :
       {"tiny.json", "demo.json", "gpt2-124m.json", "gpt2-124m-offload-cpu.json",
        "gpt2-124m-offload-nvme.json", "gpt2-124m-gpu.json", "llama-tiny.json", "llama3-8b.json"}) {
    // (--config-only: their data files, GPUs and NVMe folders are not on this machine.)
    const RunResult r =
        run(std::string("check --config-only ") + ZEROD_SOURCE_DIR + "/configs/" + name, dir_);
    EXPECT_EQ(r.code, 0) << name << ": " << r.output;
  }
}

struct BadCase {
  const char* name;
  std::string args;
  std::string file_name;  // written before the run when not empty
  std::string content;
  std::string expect;  // a piece of the message
};

TEST_F(Cli, BadInputExitsWithCode2AndAClearMessage) {
  // A shard with a wrong magic number.
  {
    std::ofstream out(dir_ / "data" / "bad_train_000000.bin", std::ios::binary);
    int32_t header[256] = {1234, 1, 10};
    out.write(reinterpret_cast<const char*>(header), sizeof(header));
    out.write(std::string(20, 'x').data(), 20);
  }
  const std::vector<BadCase> cases = {
      {"missing job file", "train nope.json", "", "", "nope.json"},
      {"malformed json", "train j.json", "j.json", "{\"train_micro_batch_size_per_gpu\": 4,,}",
       "j.json"},
      {"unknown key", "check j.json", "j.json",
       R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stagee": 1}})",
       "zero_optimization.stagee: unknown key; did you mean 'stage'?"},
      // Issue 24's bad input, through `zerod check`: an unknown optimizer parameter (named, with
      // the valid ones), compression with a stage or offload it cannot serve.
      {"an unknown optimizer parameter", "check j.json", "j.json",
       R"({"train_micro_batch_size_per_gpu": 4,
           "optimizer": {"type": "Lion", "params": {"lr": 1e-4, "eps": 1e-8}}})",
       "optimizer.params.eps: unknown key (valid for Lion: lr, betas, weight_decay)"},
      {"PowerSGD at stage 2", "check j.json", "j.json",
       R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2},
           "communication_compression": {"type": "powersgd", "rank": 4}})",
       "communication_compression.type: \"powersgd\" serves zero_optimization.stage 0 only"},
      {"1-bit Adam with the optimizer offloaded", "check j.json", "j.json",
       R"({"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "OneBitAdam"},
           "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})",
       "zero_optimization.offload_optimizer.device: offload cannot be combined with optimizer "
       "OneBitAdam"},
      {"batch triangle", "check j.json --world-size 2", "j.json",
       R"({"train_batch_size": 33, "train_micro_batch_size_per_gpu": 17, "gradient_accumulation_steps": 2,
           "train": {"steps": 1}})",
       "train_batch_size 33 != train_micro_batch_size_per_gpu 17 x gradient_accumulation_steps 2 x "
       "world size 2"},
      {"wrong type", "check j.json", "j.json", R"({"train_micro_batch_size_per_gpu": "four"})",
       "train_micro_batch_size_per_gpu"},
      {"missing data", "train j.json", "j.json", job("data/none_*.bin"), "data/none_*.bin"},
      {"bad shard", "train j.json", "j.json", job("data/bad_train_*.bin"), "bad_train_000000.bin"},
      {"not built yet", "check j.json", "j.json",
       job("data/t_train_*.bin", R"(, "aio": {"use_gds": true})"), "not implemented yet"},
      {"unknown command", "frobnicate", "", "", "frobnicate"},
      {"a checkpoint_dir that cannot be written (check)", "check j.json", "j.json",
       R"({"train_micro_batch_size_per_gpu": 4, "data": {"train": "data/t_train_*.bin"},
           "train": {"steps": 1, "checkpoint_dir": "/proc/zerod-ckpt"}})",
       "train.checkpoint_dir: checkpoints cannot be written under /proc/zerod-ckpt"},
      {"a checkpoint_dir that cannot be written (train)", "train j.json", "j.json",
       R"({"train_micro_batch_size_per_gpu": 4,
           "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 256, "seq_len": 16},
           "data": {"train": "data/t_train_*.bin"},
           "train": {"steps": 200, "save_interval": 200, "checkpoint_dir": "/proc/zerod-ckpt"}})",
       "train.checkpoint_dir: checkpoints cannot be written under /proc/zerod-ckpt"},
      {"eval without validation data", "eval j.json", "j.json",
       R"({"train_micro_batch_size_per_gpu": 4,
           "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 256, "seq_len": 16},
           "data": {"train": "data/t_train_*.bin"}, "train": {"steps": 1}})",
       "needs validation data"},
      {"generate from nowhere", "generate --from nope --prompt-tokens 1,2", "", "",
       "--from nope: no such file or directory"},
      {"generate with a text prompt and no tokenizer", "generate --from data --prompt hello", "",
       "", "needs a tokenizer"},
      {"generate with a bad token list", "generate --from data --prompt-tokens 1,x", "", "",
       "\"x\" is not a token id"},
      {"a llama job with bad heads", "check j.json", "j.json",
       R"({"train_micro_batch_size_per_gpu": 4,
           "model": {"type": "llama", "hidden_size": 64, "intermediate_size": 96,
                     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 3},
           "train": {"steps": 1}})",
       "model.num_attention_heads: 4 is not divisible by model.num_key_value_heads 3"},
      {"document masking with context parallelism", "check j.json --world-size 2", "j.json",
       R"({"train_micro_batch_size_per_gpu": 4, "parallelism": {"context": 2},
           "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 256, "seq_len": 16},
           "data": {"train": "data/t_train_*.bin", "document_masking": true, "eos_token_id": 32},
           "train": {"steps": 1}})",
       "data.document_masking: true cannot be combined with parallelism.context 2"},
      {"document masking with an EOS id outside the vocabulary", "check j.json", "j.json",
       R"({"train_micro_batch_size_per_gpu": 4,
           "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 256, "seq_len": 16},
           "data": {"train": "data/t_train_*.bin", "document_masking": true, "eos_token_id": 256},
           "train": {"steps": 1}})",
       "data.eos_token_id: 256 is not a token of the model"},
      {"more pipeline stages than layers", "check j.json --world-size 4", "j.json",
       R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4,
           "parallelism": {"pipeline": 4},
           "model": {"n_layer": 2, "n_head": 2, "n_embd": 16, "vocab_size": 256, "seq_len": 16},
           "train": {"steps": 1}})",
       "parallelism.pipeline: 4 pipeline stages for 2 layers"},
      {"a pipeline with too few micro-batches", "check j.json --world-size 2", "j.json",
       R"({"train_micro_batch_size_per_gpu": 4, "parallelism": {"pipeline": 2},
           "model": {"n_layer": 2, "n_head": 2, "n_embd": 16, "vocab_size": 256, "seq_len": 16},
           "train": {"steps": 1}})",
       "1 micro-batches (gradient_accumulation_steps) < 2 stages"},
      {"bad flag value", "train --nproc-per-node 0", "", "", "nproc-per-node"},
      {"unknown flag", "train --bogus", "", "", "bogus"},
      {"bad log level", "--log-level loud check j.json", "j.json", job(), "loud"},
      // (GPUs are hidden from the child below: a build without CUDA or a machine without a GPU.)
      {"cuda without a gpu", "train j.json", "j.json",
       R"({"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW"},
           "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 256, "seq_len": 16},
           "data": {"train": "data/t_train_*.bin"}, "train": {"steps": 2, "device": "cuda"}})",
       "train.device: \"cuda\""},
  };
  ::setenv("CUDA_VISIBLE_DEVICES", "", 1);
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.name);
    if (!c.file_name.empty()) write(c.file_name, c.content);
    const RunResult r = run(c.args, dir_);
    EXPECT_EQ(r.code, 2) << c.name << ": " << r.output;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << c.name << ": " << r.output;
    EXPECT_EQ(r.output.find("internal error"), std::string::npos) << c.name << ": " << r.output;
  }
  ::unsetenv("CUDA_VISIBLE_DEVICES");
}

// What a job needs from the machine is checked by `zerod check` and again at the start of
// `zerod train` (one function, engine/train/job_environment.h): data globs that match nothing, a
// missing init_from, "cuda" without a GPU, an nvme_path that is missing or cannot be written.
// Each is exit 2 naming the JSON key; `zerod check --config-only` checks the file alone.
TEST_F(Cli, CheckAndTrainRefuseWhatThisMachineCannotRun) {
  fs::create_directories(dir_ / "weightless");  // a directory without weights
  std::ofstream(dir_ / "weightless" / "config.json") << R"({"model_type": "gpt2"})";
  const std::string micro = R"({"train_micro_batch_size_per_gpu": 4,
      "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 256, "seq_len": 16)";
  const std::string data = R"(, "data": {"train": "data/t_train_*.bin"})";
  const std::vector<std::pair<std::string, std::string>> jobs = {
      // job, expected message
      {job("data/none_*.bin"), "data.train: no file matches 'data/none_*.bin'"},
      {std::string(job()).replace(job().find("data/t_val_*.bin"), 16, "data/v_*.bin"),
       "data.val: no file matches 'data/v_*.bin'"},
      {micro + R"(, "init_from": "absent.safetensors"})" + data + R"(, "train": {"steps": 1}})",
       "model.init_from: 'absent.safetensors' does not exist"},
      {micro + R"(, "init_from": "weightless"})" + data + R"(, "train": {"steps": 1}})",
       "model.init_from: weightless: a directory without model.safetensors"},
      {micro + "}" + data + R"(, "train": {"steps": 1, "device": "cuda"}})",
       "train.device: \"cuda\""},
      {micro + "}" + data + R"(, "zero_optimization": {"stage": 3,
           "offload_optimizer": {"device": "nvme", "nvme_path": "no_such_disk"}},
           "train": {"steps": 1}})",
       "zero_optimization.offload_optimizer.nvme_path 'no_such_disk' does not exist"},
      {micro + "}" + data + R"(, "zero_optimization": {"stage": 3,
           "offload_param": {"device": "nvme", "nvme_path": "/proc"}}, "train": {"steps": 1}})",
       "zero_optimization.offload_param.nvme_path '/proc' is not writable"},
  };
  ::setenv("CUDA_VISIBLE_DEVICES", "", 1);
  for (const auto& [content, expect] : jobs) {
    SCOPED_TRACE(expect);
    write("j.json", content);
    for (const char* command : {"check j.json", "train j.json --steps 1"}) {
      const RunResult r = run(command, dir_);
      EXPECT_EQ(r.code, 2) << command << ": " << r.output;
      EXPECT_NE(r.output.find("j.json: " + expect), std::string::npos)
          << command << ": " << r.output;
      EXPECT_EQ(r.output.find("internal error"), std::string::npos) << r.output;
      // Refused before training: no step ran.
      EXPECT_EQ(r.output.find("step 1/1"), std::string::npos) << command << ": " << r.output;
    }
    // The file alone is valid.
    const RunResult only = run("check --config-only j.json", dir_);
    EXPECT_EQ(only.code, 0) << only.output;
  }
  ::unsetenv("CUDA_VISIBLE_DEVICES");
  EXPECT_FALSE(fs::exists(dir_ / "no_such_disk"));
}

TEST_F(Cli, HelpAndVersionExitZero) {
  EXPECT_EQ(run("--help", dir_).code, 0);
  EXPECT_EQ(run("train --help", dir_).code, 0);
  const RunResult v = run("--version", dir_);
  EXPECT_EQ(v.code, 0);
  EXPECT_NE(v.output.find("0.1.0"), std::string::npos);
}

TEST_F(Cli, ZeroctlPlanRecommendsWhatFitsAndRefusesBadInput) {
  const std::string zeroctl = std::string(ZEROD_BINARY_DIR) + "/tools/zeroctl/zeroctl";
  RunResult r = run("plan --model gpt2 --world 2 --gpu-mem 80GiB", dir_, zeroctl);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("recommended: ZeRO-0 (DDP)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("0.124B parameters"), std::string::npos) << r.output;
  // A job file: its shape, micro-batch, sequence and dtype.
  write("job.json", job());
  r = run("plan --model job.json --world 4 --gpu-mem 1GiB --offload none", dir_, zeroctl);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("micro-batch 4 x 16"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("offload"), std::string::npos) << r.output;  // none considered
  // Nothing fits, or bad input: exit 2.
  r = run("plan --model gpt2-xl --world 1 --gpu-mem 100MiB", dir_, zeroctl);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("nothing fits"), std::string::npos) << r.output;
  for (const char* bad : {"plan --model gpt5 --world 2", "plan --model gpt2 --gpu-mem lots",
                          "plan --model gpt2 --world 0", "plan --model missing.json",
                          "plan --model gpt2 --world 2 --expert 2" /* a dense model */}) {
    r = run(bad, dir_, zeroctl);
    EXPECT_EQ(r.code, 2) << bad << ": " << r.output;
    EXPECT_EQ(r.output.find("internal error"), std::string::npos) << r.output;
  }
}

TEST_F(Cli, CommsLoggerReportsCollectivesPerKind) {
  write("job.json", job("data/t_train_*.bin", R"(, "comms_logger": {"enabled": true},
      "zero_optimization": {"stage": 2})"));
  const RunResult r = run("train job.json --nproc-per-node 2", dir_);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("(comms_logger)"), std::string::npos) << r.output;
  for (const char* op : {"all_gather", "reduce_scatter", "all_reduce"}) {
    EXPECT_NE(r.output.find(std::string("  ") + op), std::string::npos) << op << "\n" << r.output;
  }
  EXPECT_NE(r.output.find("busbw"), std::string::npos) << r.output;
  // The memory report: every rank, at the start and at the end.
  for (const char* line : {"[rank 0] memory at the start", "[rank 1] memory at the start",
                           "[rank 0] memory at the end", "[rank 1] memory at the end"}) {
    EXPECT_NE(r.output.find(line), std::string::npos) << line << "\n" << r.output;
  }
}

}  // namespace
}  // namespace zerod
