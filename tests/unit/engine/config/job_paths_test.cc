// A job's file paths and where relative ones resolve: parse_job_text with a base directory (the
// daemon: the submitted job file's directory) makes every relative path absolute against it,
// the Hugging Face directory of model.init_from included (its config.json is read from there);
// without one they stay as written (zerod train: the current directory), and
// require_absolute_paths names the key of each relative one.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "config_test_util.h"

namespace zerod {
namespace {

using nlohmann::json;
using testing_config::job_with;

// A job with every kind of path, all relative.
json every_path() {
  return {{"data", {{"train", json::array({"data/a_*.bin", "../b/*.bin"})}, {"val", "v/*.bin"}}},
          {"model", {{"init_from", "weights.safetensors"}}},
          {"train", {{"checkpoint_dir", "./ckpt"}}},
          {"csv_monitor", {{"enabled", true}, {"job_name", "j"}}},  // output_path "": "."
          {"tensorboard", {{"enabled", true}, {"output_path", "tb"}}},
          {"zero_optimization",
           {{"stage", 3},
            {"offload_param", {{"device", "nvme"}, {"nvme_path", "nvme/p"}}},
            {"offload_optimizer", {{"device", "nvme"}, {"nvme_path", "/abs/nvme"}}}}}};
}

TEST(JobPaths, ABaseDirectoryMakesEveryRelativePathAbsolute) {
  const ParsedJob job = parse_job_text(job_with(every_path()), "job.json", "/jobs/run1");
  const JobConfig& c = job.config;
  EXPECT_EQ(c.data.train, (std::vector<std::string>{"/jobs/run1/data/a_*.bin", "/jobs/b/*.bin"}));
  EXPECT_EQ(c.data.val, (std::vector<std::string>{"/jobs/run1/v/*.bin"}));
  EXPECT_EQ(c.model.init_from.value_or(""), "/jobs/run1/weights.safetensors");
  EXPECT_EQ(c.train.checkpoint_dir, "/jobs/run1/ckpt");
  EXPECT_EQ(c.csv_monitor.output_path, "/jobs/run1/");
  EXPECT_EQ(c.tensorboard.output_path, "/jobs/run1/tb");
  EXPECT_EQ(c.zero.offload_param.nvme_path, "/jobs/run1/nvme/p");
  EXPECT_EQ(c.zero.offload_optimizer.nvme_path, "/abs/nvme");  // absolute: as it was
  // The resolved job (what node daemons receive) reads back the same, with no base directory.
  EXPECT_EQ(parse_job_text(job_to_json(c).dump(), "job.json").config, c);
  EXPECT_NO_THROW(require_absolute_paths(c));
}

TEST(JobPaths, WithoutABaseDirectoryPathsStayAsWritten) {
  const ParsedJob job = parse_job_text(job_with(every_path()), "job.json");
  EXPECT_EQ(job.config.data.train[0], "data/a_*.bin");
  EXPECT_EQ(job.config.train.checkpoint_dir, "./ckpt");
  EXPECT_EQ(job.config.csv_monitor.output_path, "");
  // A request with no base directory: each relative path is named by its key.
  try {
    require_absolute_paths(job.config);
    FAIL() << "relative paths accepted";
  } catch (const ConfigError& e) {
    std::vector<std::string> keys;
    for (const std::string& p : e.problems()) keys.push_back(p.substr(0, p.find(':')));
    EXPECT_EQ(keys, (std::vector<std::string>{"data.train[0]", "data.train[1]", "data.val[0]",
                                              "model.init_from", "train.checkpoint_dir",
                                              "csv_monitor.output_path", "tensorboard.output_path",
                                              "zero_optimization.offload_param.nvme_path"}));
    EXPECT_NE(std::string(e.what()).find("SubmitJobRequest.base_dir"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(parse_job_text(job_with(every_path()), "job.json", "relative/base"), InputError);
}

// model.init_from naming a Hugging Face directory relative to the base directory: its
// config.json is read from there, not from the process's current directory.
TEST(JobPaths, InitFromADirectoryIsReadUnderTheBaseDirectory) {
  const auto base =
      std::filesystem::temp_directory_path() / ("zerod_job_paths_" + std::to_string(::getpid()));
  std::filesystem::create_directories(base / "hf");
  std::ofstream(base / "hf" / "config.json") << R"({"model_type": "llama", "hidden_size": 64,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
      "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 64})";
  const ParsedJob job = parse_job_text(
      job_with({{"model", {{"init_from", "hf"}, {"seq_len", 32}}}}), "job.json", base.string());
  EXPECT_EQ(job.config.model.type, "llama");
  EXPECT_EQ(job.config.model.n_layer, 2);
  EXPECT_EQ(job.config.model.init_from.value_or(""), (base / "hf").string());
  std::filesystem::remove_all(base);
}

}  // namespace
}  // namespace zerod
