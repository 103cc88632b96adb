// Checkpoints through the zerod binary: a save killed half-way leaves `latest` on the previous
// checkpoint and resume works; SIGTERM saves at the next step boundary and exits 0 with a
// loadable checkpoint at the step it reports; bad --resume requests exit 2 and touch nothing.
// Also what a run shows while it trains: zeroctl export / init_from, and /metrics scraped
// during a run.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "engine/checkpoint/checkpoint_dir.h"
#include "engine/data/corpus.h"
#include "process_util.h"

namespace zerod {
namespace {

namespace fs = std::filesystem;
using testing::metric;
using testing::Process;
using testing::scrape;
using testing::zeroctl_binary;
using testing::zerod_binary;
using namespace std::chrono_literals;

class CheckpointCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::make_test_dir("zerod_ckpt_cli", "checkpoints must never lose work. ");
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write_job(int steps, int save_interval) {
    std::ofstream(dir_ / "job.json")
        << R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4,
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
      "zero_optimization": {"stage": 3}, "steps_per_print": 1,
      "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 256, "seq_len": 16},
      "data": {"train": "data/c_train_*.bin"},
      "train": {"steps": )"
        << steps << R"(, "checkpoint_dir": "ckpt", "save_interval": )" << save_interval << "}}";
  }
  std::unique_ptr<Process> start(const std::vector<std::string>& args, const std::string& log,
                                 const std::string& env = "",
                                 const std::string& binary = zerod_binary()) {
    return testing::start_in(dir_, args, log, env, binary);
  }
  static double loss_at(const std::string& out, int step) {
    return testing::printed_loss(out, step);
  }

  fs::path dir_;
};

TEST_F(CheckpointCli, SaveKilledHalfWayLeavesLatestOnThePreviousCheckpoint) {
  write_job(8, 3);
  // Two ranks; the process dies (SIGKILL) after writing a rank file of global_step6.
  auto p = start({"train", "job.json", "--nproc-per-node", "2"}, "killed.log",
                 "ZEROD_FAULTS=save.rank_file@3=kill");  // 2 ranks a save: global_step6
  EXPECT_EQ(p->wait_for(120s), -9) << p->output();
  EXPECT_EQ(read_latest((dir_ / "ckpt").string()).value_or(""), "global_step3");
  EXPECT_TRUE(fs::exists(dir_ / "ckpt" / "global_step6.tmp"));
  EXPECT_FALSE(fs::exists(dir_ / "ckpt" / "global_step6"));
  // Resume works, from step 3.
  auto r =
      start({"train", "job.json", "--nproc-per-node", "2", "--resume", "latest"}, "resumed.log");
  ASSERT_EQ(r->wait_for(120s), 0) << r->output();
  EXPECT_NE(r->output().find("resumed from ckpt/global_step3 (step 3"), std::string::npos)
      << r->output();
  EXPECT_NE(r->output().find("step 4/8"), std::string::npos) << r->output();
  EXPECT_EQ(read_latest((dir_ / "ckpt").string()).value_or(""), "global_step8");
  EXPECT_FALSE(fs::exists(dir_ / "ckpt" / "global_step6.tmp"));  // the stale save was cleaned up
}

TEST_F(CheckpointCli, SigtermSavesAtTheNextStepAndTheCheckpointResumesExactly) {
  write_job(1000000, 0);
  auto p = start({"train", "job.json", "--nproc-per-node", "2"}, "term.log");
  ASSERT_TRUE(p->wait_output("5/1000000 | loss", 60s)) << p->output();
  ::kill(p->pid(), SIGTERM);
  ASSERT_EQ(p->wait_for(60s), 0) << p->output();
  const std::string out = p->output();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      out, m, std::regex("checkpoint (global_step([0-9]+)) saved at step ([0-9]+)")))
      << out;
  const int step = std::stoi(m[3]);
  EXPECT_EQ(m[1].str(), "global_step" + std::to_string(step));
  EXPECT_EQ(read_latest((dir_ / "ckpt").string()).value_or(""), m[1].str());
  // The checkpoint loads and training continues at step + 1 with the uninterrupted run's loss.
  auto r = start({"train", "job.json", "--nproc-per-node", "2", "--resume", "latest", "--steps",
                  std::to_string(step + 2)},
                 "after.log");
  ASSERT_EQ(r->wait_for(60s), 0) << r->output();
  fs::remove_all(dir_ / "ckpt");
  auto whole =
      start({"train", "job.json", "--nproc-per-node", "2", "--steps", std::to_string(step + 2)},
            "whole.log");
  ASSERT_EQ(whole->wait_for(60s), 0) << whole->output();
  EXPECT_GT(loss_at(r->output(), step + 1), 0) << r->output();
  EXPECT_EQ(loss_at(r->output(), step + 1), loss_at(whole->output(), step + 1));
  EXPECT_EQ(loss_at(r->output(), step + 2), loss_at(whole->output(), step + 2));
}

TEST_F(CheckpointCli, BadResumeRequestsExit2AndTouchNothing) {
  write_job(4, 2);
  {
    auto p = start({"train", "job.json", "--resume", "latest"}, "missing.log");
    EXPECT_EQ(p->wait_for(60s), 2) << p->output();
    EXPECT_NE(p->output().find("does not exist"), std::string::npos) << p->output();
  }
  {
    auto p = start({"train", "job.json", "--resume", "auto"}, "auto.log");  // nothing yet: fresh
    EXPECT_EQ(p->wait_for(60s), 0) << p->output();
    EXPECT_NE(p->output().find("starting from step 0"), std::string::npos) << p->output();
  }
  const auto before = fs::last_write_time(dir_ / "ckpt" / "latest");
  for (const char* bad : {"nope", "../etc", "latest.tmp"}) {
    auto p = start({"train", "job.json", "--resume", bad}, "bad.log");
    EXPECT_EQ(p->wait_for(60s), 2) << bad << ": " << p->output();
    EXPECT_EQ(p->output().find("internal error"), std::string::npos) << p->output();
  }
  EXPECT_EQ(fs::last_write_time(dir_ / "ckpt" / "latest"), before);
  EXPECT_EQ(read_latest((dir_ / "ckpt").string()).value_or(""), "global_step4");
}

// GPT-2's byte-level alphabet (bytes_to_unicode): the character byte b is written as, UTF-8.
std::string gpt2_byte_char(int b) {
  static const std::vector<uint32_t> table = [] {
    std::vector<uint32_t> t(256);
    uint32_t next = 256;
    for (int c = 0; c < 256; ++c) {
      const bool direct = (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174);
      t[static_cast<size_t>(c)] = direct ? static_cast<uint32_t>(c) : next++;
    }
    return t;
  }();
  const uint32_t cp = table[static_cast<size_t>(b)];
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else {  // (all below 0x800)
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

// zerod generate with a tokenizer: --prompt TEXT is encoded with it and the new tokens are
// printed as text; the same as --prompt-tokens with the text's ids. The tokenizer is GPT-2's
// file format with the 256 byte tokens as ids 0..255 and no merges, so its ids are the bytes the
// byte-level model was trained on. A .model file is refused with the reason; --prompt without a
// tokenizer names the ways to give one.
TEST_F(CheckpointCli, GenerateTakesAndPrintsTextWithATokenizer) {
  write_job(6, 6);
  auto t = start({"train", "job.json"}, "train.log");
  ASSERT_EQ(t->wait_for(60s), 0) << t->output();
  fs::create_directories(dir_ / "tok");
  {
    std::ofstream vocab(dir_ / "tok" / "vocab.json", std::ios::binary);
    vocab << "{";
    for (int b = 0; b < 256; ++b) {
      std::string key = gpt2_byte_char(b);
      if (key == "\"" || key == "\\") key = "\\" + key;
      vocab << (b ? "," : "") << "\"" << key << "\":" << b;
    }
    vocab << "}";
    std::ofstream(dir_ / "tok" / "merges.txt") << "#version: 0.2\n";
  }
  auto run = [&](std::vector<std::string> args, const std::string& log) {
    auto p = start(std::move(args), log);
    const int rc = p->wait_for(60s);
    return std::make_pair(rc, p->output());
  };
  const std::string prompt = "check";  // (5 + 10 new tokens: within seq_len 16)
  std::string prompt_ids;
  for (unsigned char c : prompt) prompt_ids += (prompt_ids.empty() ? "" : ",") + std::to_string(c);
  auto [rc_ids, out_ids] =
      run({"generate", "--from", "ckpt", "--prompt-tokens", prompt_ids, "--max-new-tokens", "10"},
          "ids.log");
  ASSERT_EQ(rc_ids, 0) << out_ids;
  // stdout's line of ids (log lines on stderr may come before it).
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out_ids, m, std::regex("(^|\n)([0-9]+( [0-9]+)*)\n"))) << out_ids;
  const std::string ids_line = m[2].str();
  std::string expected;  // the bytes of those ids
  {
    std::istringstream in(ids_line);
    int id;
    int n = 0;
    while (in >> id) {
      ASSERT_GE(id, 0);
      ASSERT_LT(id, 256);
      expected += static_cast<char>(id);
      ++n;
    }
    ASSERT_EQ(n, 10) << out_ids;
  }
  auto [rc_text, out_text] = run({"generate", "--from", "ckpt", "--tokenizer", "tok", "--prompt",
                                  prompt, "--max-new-tokens", "10"},
                                 "text.log");
  ASSERT_EQ(rc_text, 0) << out_text;
  EXPECT_NE(out_text.find(expected + "\n"), std::string::npos)
      << "expected the text \"" << expected << "\" on a line; got: " << out_text;
  EXPECT_NE(out_text.find("prompt ids " + std::to_string(prompt.size()) + ", new ids: " + ids_line),
            std::string::npos)
      << out_text;
  EXPECT_NE(out_text.find("GPT-2 vocab.json + merges.txt"), std::string::npos) << out_text;
  // Refusals: exit 2 with the reason.
  std::ofstream(dir_ / "tok.model") << "not a model";
  auto [rc_sp, out_sp] =
      run({"generate", "--from", "ckpt", "--tokenizer", "tok.model", "--prompt", prompt}, "sp.log");
  EXPECT_EQ(rc_sp, 2) << out_sp;
  EXPECT_NE(out_sp.find("cannot load SentencePiece .model files"), std::string::npos) << out_sp;
  auto [rc_none, out_none] = run({"generate", "--from", "ckpt", "--prompt", prompt}, "none.log");
  EXPECT_EQ(rc_none, 2) << out_none;
  EXPECT_NE(out_none.find("--prompt \"...\" needs a tokenizer: give --tokenizer PATH"),
            std::string::npos)
      << out_none;
  auto [rc_both, out_both] =
      run({"generate", "--from", "ckpt", "--prompt", prompt, "--prompt-tokens", "1"}, "both.log");
  EXPECT_EQ(rc_both, 2) << out_both;
  EXPECT_NE(out_both.find("not both"), std::string::npos) << out_both;
}

TEST_F(CheckpointCli, ZeroctlExportAndInitFrom) {
  write_job(4, 2);
  auto t = start({"train", "job.json", "--nproc-per-node", "2"}, "train.log");
  ASSERT_EQ(t->wait_for(60s), 0) << t->output();
  auto ctl = [&](std::vector<std::string> args, const std::string& log) {
    auto p = start(std::move(args), log, "", zeroctl_binary());
    const int rc = p->wait_for(60s);
    return std::make_pair(rc, p->output());
  };
  auto [rc, out] = ctl({"export", "ckpt", "--out", "model.safetensors"}, "export.log");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("exported ckpt/global_step4 (global step 4"), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(dir_ / "model.safetensors"));
  const auto written = fs::last_write_time(dir_ / "model.safetensors");
  // Bad requests: exit 2, the existing file untouched.
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"export", "ckpt", "--out", "model.safetensors"},
        std::vector<std::string>{"export", "ckpt", "--tag", "nope", "--out", "m2.safetensors"},
        std::vector<std::string>{"export", "missing", "--out", "m3.safetensors"},
        std::vector<std::string>{"export", "ckpt", "--out", "m4.safetensors", "--dtype", "fp16"},
        std::vector<std::string>{"export", "ckpt"}}) {
    auto [brc, bout] = ctl(bad, "bad.log");
    EXPECT_EQ(brc, 2) << bout;
    EXPECT_EQ(bout.find("internal error"), std::string::npos) << bout;
  }
  EXPECT_EQ(fs::last_write_time(dir_ / "model.safetensors"), written);
  for (const char* f : {"m2.safetensors", "m3.safetensors", "m4.safetensors"})
    EXPECT_FALSE(fs::exists(dir_ / f)) << f;
  std::tie(rc, out) = ctl({"export", "ckpt", "--tag", "global_step2", "--out", "model.safetensors",
                           "--dtype", "bf16", "--force"},
                          "bf16.log");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("bf16"), std::string::npos) << out;

  // Fine-tuning from the export, and a clear exit 2 for a missing file.
  std::string job;
  {
    std::ifstream in(dir_ / "job.json");
    job.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string shape = R"("seq_len": 16})";
  std::ofstream(dir_ / "tune.json") << std::string(job).replace(
      job.find(shape), shape.size(), R"("seq_len": 16, "init_from": "model.safetensors"})");
  std::ofstream(dir_ / "nofile.json") << std::string(job).replace(
      job.find(shape), shape.size(), R"("seq_len": 16, "init_from": "absent.safetensors"})");
  auto tune = start({"train", "tune.json", "--steps", "1"}, "tune.log");
  EXPECT_EQ(tune->wait_for(60s), 0) << tune->output();
  EXPECT_NE(tune->output().find("init_from: weights from model.safetensors"), std::string::npos)
      << tune->output();
  auto missing = start({"train", "nofile.json", "--steps", "1"}, "nofile.log");
  EXPECT_EQ(missing->wait_for(60s), 2) << missing->output();
  EXPECT_NE(missing->output().find("absent.safetensors"), std::string::npos) << missing->output();

  // init_from a directory: a save_pretrained one (config.json, sharded weights and their index),
  // and one holding only model.safetensors (the job gives the shape).
  std::tie(rc, out) =
      ctl({"export", "ckpt", "--out", "hf", "--max-shard-size", "20KB"}, "export-dir.log");
  ASSERT_EQ(rc, 0) << out;
  ASSERT_TRUE(fs::exists(dir_ / "hf" / "model.safetensors.index.json"));
  fs::create_directories(dir_ / "weights");
  fs::copy_file(dir_ / "model.safetensors", dir_ / "weights" / "model.safetensors");
  for (const char* from : {"hf", "weights"}) {
    SCOPED_TRACE(from);
    std::ofstream(dir_ / "dir.json") << std::string(job).replace(
        job.find(shape), shape.size(),
        std::string(R"("seq_len": 16, "init_from": ")") + from + R"("})");
    auto check = start({"check", "dir.json"}, "dir-check.log");
    EXPECT_EQ(check->wait_for(60s), 0) << check->output();
    auto p = start({"train", "dir.json", "--steps", "1"}, "dir.log");
    EXPECT_EQ(p->wait_for(60s), 0) << p->output();
    EXPECT_NE(p->output().find(std::string("init_from: weights from ") + from), std::string::npos)
        << p->output();
  }
}

#ifdef ZEROD_HAVE_PROMETHEUS
TEST_F(CheckpointCli, PrometheusMetricsDuringARun) {
  write_job(1000000, 0);
  auto p =
      start({"train", "job.json", "--nproc-per-node", "2", "--metrics-port", "0"}, "metrics.log");
  ASSERT_TRUE(p->wait_output("/metrics", 30s)) << p->output();
  std::smatch m;
  const std::string out = p->output();
  ASSERT_TRUE(std::regex_search(out, m, std::regex("127\\.0\\.0\\.1:([0-9]+)/metrics"))) << out;
  const int port = std::stoi(m[1]);
  ASSERT_TRUE(p->wait_output("5/1000000 | loss", 60s)) << p->output();
  const std::string text = scrape(port);
  EXPECT_NE(text.find("HTTP/1.1 200 OK"), std::string::npos) << text;
  for (const char* rank : {"0", "1"}) {
    const std::string r = std::string("{rank=\"") + rank + "\"}";
    const double loss = metric(text, "zerod_loss" + r);
    EXPECT_GT(loss, 0.0) << text;
    EXPECT_LT(loss, 10.0) << text;
    EXPECT_GT(metric(text, "zerod_tokens_per_second" + r), 0.0) << text;
    EXPECT_GT(metric(text, "zerod_memory_bytes" + r), 0.0) << text;
    EXPECT_GE(metric(text, "zerod_steps_total" + r), 1.0) << text;
    EXPECT_EQ(metric(text, "zerod_skipped_steps_total" + r), 0.0) << text;
    // Stage 3 gathers weights and reduce-scatters gradients.
    EXPECT_GT(metric(text, std::string("zerod_collective_bytes_total{op=\"all_gather\",rank=\"") +
                               rank + "\"}"),
              0.0)
        << text;
  }
  EXPECT_NE(scrape(port).find("zerod_step{rank=\"0\"}"), std::string::npos);
  ::kill(p->pid(), SIGTERM);
  EXPECT_EQ(p->wait_for(60s), 0) << p->output();
}
#endif  // ZEROD_HAVE_PROMETHEUS

}  // namespace
}  // namespace zerod
