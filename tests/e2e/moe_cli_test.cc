// Mixture of experts through the zerod binary: `zerod check` prints the MoE blocks and expert
// parameters, `zerod train` of a tiny Mixtral and of GPT-2 with a moe section brings the loss
// down, and what experts do not run with is refused with exit code 2 naming the key.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include "engine/data/corpus.h"
#include "run_command.h"

namespace zerod {
namespace {

namespace fs = std::filesystem;
using testing::RunResult;

class MoeCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("zerod_moe_cli_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::string text;
    while (text.size() < 40000) text += "hello zerod, route me to an expert please. ";
    write_text_shards({reinterpret_cast<const uint8_t*>(text.data()), text.size()},
                      (dir_ / "data").string(), 0.1, 1 << 20, "t");
  }
  void TearDown() override { fs::remove_all(dir_); }

  RunResult zerod(const std::string& args) {
    return testing::run_in(dir_, std::string(ZEROD_BINARY_DIR) + "/engine/zerod", args);
  }
  void write_job(const std::string& model, const std::string& top_extra = "") {
    std::ofstream(dir_ / "job.json") << R"({"train_micro_batch_size_per_gpu": 4,
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.0}},
      "steps_per_print": 10,
      "model": )" + model + R"(,
      "data": {"train": "data/t_train_*.bin"},
      "train": {"steps": 30})" + top_extra + "}";
  }
  // "done: ... loss A -> B" of a training run's last line.
  static std::pair<double, double> first_last(const std::string& out) {
    std::smatch m;
    const std::regex re(R"(loss ([0-9.]+) -> ([0-9.]+))");
    if (!std::regex_search(out, m, re)) return {0, 0};
    return {std::stod(m[1]), std::stod(m[2])};
  }
  fs::path dir_;
};

const char* kMixtral = R"({"type": "mixtral", "hidden_size": 32, "intermediate_size": 48,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "vocab_size": 256, "num_local_experts": 4, "num_experts_per_tok": 2,
    "output_router_logits": true, "seq_len": 16})";

TEST_F(MoeCli, CheckPrintsTheExpertsAndATinyMixtralTrains) {
  write_job(kMixtral);
  const RunResult c = zerod("check job.json");
  ASSERT_EQ(c.code, 0) << c.output;
  EXPECT_NE(c.output.find("zerod: mixture of experts: blocks 0,1 (2 of 2), 4 experts x 4.6K "
                          "parameters + router, top-2 renormalised, dropless, aux loss 0.001 x "
                          "(Hugging Face, all layers)"),
            std::string::npos)
      << c.output;
  const RunResult r = zerod("train job.json");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("mixture of experts: blocks 0,1"), std::string::npos) << r.output;
  const auto [first, last] = first_last(r.output);
  EXPECT_GT(first, 5.0) << r.output;  // about ln 256 at the start
  EXPECT_LT(last, first - 1.0) << r.output;
}

TEST_F(MoeCli, Gpt2WithAMoeSectionTrainsWithCapacityAndCheckpointing) {
  write_job(R"({"n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 256, "seq_len": 16,
      "activation_checkpointing": true,
      "moe": {"num_experts": 4, "top_k": 2, "capacity_factor": 1.0, "min_capacity": 2,
              "aux_loss_coef": 0.01, "router_z_loss_coef": 0.001, "moe_layer_frequency": 2,
              "shared_experts": 1}})");
  const RunResult r = zerod("train job.json");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("mixture of experts: blocks 0 (1 of 2), 4 experts"), std::string::npos)
      << r.output;
  const auto [first, last] = first_last(r.output);
  EXPECT_LT(last, first - 1.0) << r.output;
}

// Expert parallelism as two processes on loopback: a tiny Mixtral (4 experts, top-2, dropless)
// with parallelism.expert 2 (two experts per process, tokens dispatched between them) trains the
// losses of expert 1 (every process holding every expert) at the same global batch, to the
// 4 decimals the final line prints.
TEST_F(MoeCli, ExpertParallelTwoProcessesTrainTheLossesOfOne) {
  std::pair<double, double> losses[2];
  for (int E : {1, 2}) {
    write_job(kMixtral, R"(, "parallelism": {"expert": )" + std::to_string(E) + "}");
    const RunResult r = zerod("train job.json --nproc-per-node 2");
    ASSERT_EQ(r.code, 0) << r.output;
    losses[E - 1] = first_last(r.output);
    ASSERT_GT(losses[E - 1].first, 0.0) << r.output;
  }
  EXPECT_NEAR(losses[1].first, losses[0].first, 1.5e-4);
  EXPECT_NEAR(losses[1].second, losses[0].second, 1.5e-4);
  EXPECT_LT(losses[1].second, losses[1].first - 1.0);
}

TEST_F(MoeCli, WhatExpertsDoNotRunWithExitsWithCode2) {
  struct Bad {
    std::string model, top, message;
  };
  const Bad cases[] = {
      {kMixtral, R"(, "parallelism": {"expert": 3})",
       "parallelism.expert: 3 does not divide the 4 experts (model.num_local_experts)"},
      {kMixtral, R"(, "parallelism": {"expert": 4})",
       "parallelism.expert 4 does not divide the world size 2"},
      {R"({"n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 256, "seq_len": 16,
          "moe": {"num_experts": 2, "top_k": 1}})",
       R"(, "parallelism": {"context": 2})",
       "model.moe.drop_tokens: true with parallelism.context 2"},
      {R"({"n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 256, "seq_len": 16,
          "moe": {"num_experts": 2, "top_k": 3}})",
       "", "model.moe.top_k: 3 is more than the 2 experts (model.moe.num_experts)"},
      {R"({"n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 256, "seq_len": 16,
          "moe": {"num_experts": 2, "capacity_factor": 0}})",
       "", "model.moe.capacity_factor: 0"},
  };
  for (const Bad& b : cases) {
    write_job(b.model, b.top);
    const RunResult r = zerod("check job.json --world-size 2");
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find(b.message), std::string::npos) << r.output;
  }
  // The CUDA backend has no MoE ops: refused at check, on any machine.
  std::ofstream(dir_ / "job.json") << R"({"train_micro_batch_size_per_gpu": 4,
      "model": )" + std::string(kMixtral) +
                                          R"(, "data": {"train": "data/t_train_*.bin"},
      "train": {"steps": 1, "device": "cuda"}})";
  const RunResult r = zerod("check job.json --config-only");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("train.device: \"cuda\" cannot run type \"mixtral\""), std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace zerod
