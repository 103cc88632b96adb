// The file paths of a job and where relative ones resolve (parse.h: rebase_job_paths,
// require_absolute_paths).
#include <filesystem>
#include <functional>

#include <fmt/format.h>

#include "core/error.h"
#include "engine/config/input_limits.h"
#include "engine/config/parse.h"

namespace zerod {

namespace {

namespace fs = std::filesystem;

// Calls f(json key, path) for every path of the job that names a file or directory. An enabled
// monitor's empty output_path ("the current directory") is passed too.
void for_each_path(JobConfig& c, const std::function<void(const std::string&, std::string&)>& f) {
  for (size_t i = 0; i < c.data.train.size(); ++i)
    f(fmt::format("data.train[{}]", i), c.data.train[i]);
  for (size_t i = 0; i < c.data.val.size(); ++i) f(fmt::format("data.val[{}]", i), c.data.val[i]);
  if (!c.data.tokenizer.empty()) f("data.tokenizer", c.data.tokenizer);
  if (c.model.init_from) f("model.init_from", *c.model.init_from);
  if (!c.train.checkpoint_dir.empty()) f("train.checkpoint_dir", c.train.checkpoint_dir);
  if (c.csv_monitor.enabled) f("csv_monitor.output_path", c.csv_monitor.output_path);
  if (c.tensorboard.enabled) f("tensorboard.output_path", c.tensorboard.output_path);
  if (!c.zero.offload_param.nvme_path.empty())
    f("zero_optimization.offload_param.nvme_path", c.zero.offload_param.nvme_path);
  if (!c.zero.offload_optimizer.nvme_path.empty())
    f("zero_optimization.offload_optimizer.nvme_path", c.zero.offload_optimizer.nvme_path);
}

}  // namespace

std::string rebase_path(const std::string& path, const std::string& base_dir) {
  if (!path.empty() && fs::path(path).is_absolute()) return path;
  return (fs::path(base_dir) / path).lexically_normal().string();
}

void rebase_job_paths(JobConfig& cfg, const std::string& base_dir) {
  ZD_CHECK_INPUT(fs::path(base_dir).is_absolute(),
                 "the base directory of a job's relative paths must be absolute, not \"{}\"",
                 config::clip_input(base_dir));
  for_each_path(cfg, [&](const std::string&, std::string& p) { p = rebase_path(p, base_dir); });
}

void require_absolute_paths(const JobConfig& cfg) {
  JobConfig copy = cfg;
  std::vector<std::string> problems;
  for_each_path(copy, [&](const std::string& key, std::string& p) {
    if (!p.empty() && fs::path(p).is_absolute()) return;
    problems.push_back(fmt::format(
        "{}: \"{}\" is a relative path{}, and the request gave no base directory to resolve it "
        "against (SubmitJobRequest.base_dir, which zeroctl sets to the job file's directory): "
        "give an absolute path",
        key, config::clip_input(p), p.empty() ? " (empty: the current directory)" : ""));
  });
  if (!problems.empty()) throw ConfigError(std::move(problems), cfg.source);
}

}  // namespace zerod
