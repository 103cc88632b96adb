#include "engine/train/job_environment.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "engine/checkpoint/checkpoint_dir.h"
#include "engine/checkpoint/hf_model.h"
#include "engine/config/config_error.h"
#include "engine/data/glob.h"
#include "engine/train/job_tokenizer.h"
#include "engine/train/offload_preflight.h"
#include "engine/train/rank_device.h"

namespace zerod {

namespace fs = std::filesystem;

namespace {

// Runs `check`; an InputError it throws becomes one problem line (its message names the key).
template <typename F>
void collect(std::vector<std::string>& problems, F&& check) {
  try {
    check();
  } catch (const InputError& e) {
    problems.emplace_back(e.what());
  }
}

void check_init_from(const std::string& from, std::vector<std::string>& problems) {
  constexpr const char* kKey = "model.init_from";
  std::error_code ec;
  if (!fs::exists(from, ec)) {
    problems.push_back(fmt::format(
        "{}: '{}' does not exist (a safetensors file or a Hugging Face save_pretrained directory)",
        kKey, from));
    return;
  }
  if (!fs::is_directory(from, ec)) {
    if (!std::ifstream(from, std::ios::binary))
      problems.push_back(fmt::format("{}: '{}' cannot be read", kKey, from));
    return;
  }
  // A directory: the weights the trainer will load, model.safetensors or the shards of
  // model.safetensors.index.json.
  try {
    for (const std::string& f : hf_weight_files(from)) {
      if (!std::ifstream(f, std::ios::binary)) {
        problems.push_back(fmt::format("{}: {} cannot be read", kKey, f));
        return;
      }
    }
  } catch (const InputError& e) {
    problems.push_back(fmt::format("{}: {}", kKey, e.what()));
  }
}
}  // namespace

void check_job_environment(const JobConfig& cfg, const JobEnvironmentOptions& options) {
  std::vector<std::string> problems;
  collect(problems, [&] { expand_globs(cfg.data.train, "data.train"); });
  collect(problems, [&] { expand_globs(cfg.data.val, "data.val"); });
  collect(problems, [&] { load_job_tokenizer(cfg); });  // loads, and fits model.vocab_size
  if (cfg.model.init_from) check_init_from(*cfg.model.init_from, problems);
  if (std::string p = train_device_problem(cfg, options.local_ranks); !p.empty())
    problems.push_back(std::move(p));
  const OffloadOptimizerConfig& oo = cfg.zero.offload_optimizer;
  if (oo.device == OffloadDevice::kNvme) {
    std::string p =
        nvme_path_problem(oo.nvme_path, "zero_optimization.offload_optimizer.nvme_path");
    if (!p.empty()) problems.push_back(std::move(p));
  }
  const OffloadParamConfig& op = cfg.zero.offload_param;
  if (op.device == OffloadDevice::kNvme) {
    std::string p = nvme_path_problem(op.nvme_path, "zero_optimization.offload_param.nvme_path");
    if (!p.empty()) problems.push_back(std::move(p));
  }
  if (!cfg.train.checkpoint_dir.empty()) {
    // Probed where the directory is or would be created; nothing is created.
    collect(problems, [&] {
      probe_checkpoint_dir(cfg.train.checkpoint_dir, "train.checkpoint_dir", /*create=*/false,
                           fmt::format("{}-check", ::getpid()));
    });
  }
  if (!problems.empty()) throw ConfigError(std::move(problems), cfg.source);
}

}  // namespace zerod
