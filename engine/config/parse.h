// Job file -> JobConfig. A job file is a DeepSpeed ds_config (JSON; // and /* */ comments allowed)
// plus zerod's `model`, `data` and `train` sections (DESIGN.md section 1).
//
//   ParsedJob job = load_job_file("job.json");  // every key type- and range-checked
//   resolve_job(job.config, world_size);         // batch triangle + derived values
//   check_supported(job.config);                 // recognised but not built yet -> error
//
// DeepSpeed's key names, defaults, derivations and deprecated spellings are honoured; where
// DeepSpeed is lax zerod is strict: unknown keys, wrong types and values out of range are errors
// naming the JSON path, the value and what is allowed, all problems of a file at once.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/config/config_error.h"
#include "engine/config/job_config.h"

namespace zerod {

struct ParsedJob {
  JobConfig config;
  std::vector<std::string> warnings;  // deprecated keys mapped to their new form, no-op keys, ...
};

// Parses and validates one job file's text. `source_name` names it in messages and is stored in
// JobConfig::source. Also fills in the values that do not depend on the world size
// (model.padded_vocab_size, zero.overlap_comm_resolved). Throws ConfigError listing every problem.
// With a base_dir (absolute), the job's relative paths resolve against it (rebase_job_paths;
// `zerod serve`: the submitted job file's directory); without, they stay as written and resolve
// against the process's current directory (`zerod train`, `zerod check`, `zerod eval`).
ParsedJob parse_job_text(std::string_view text, const std::string& source_name,
                         const std::string& base_dir = "");

// The job's file paths: data.train and data.val globs, model.init_from, train.checkpoint_dir,
// csv_monitor.output_path and tensorboard.output_path of an enabled monitor (empty: the current
// directory), zero_optimization.offload_param/offload_optimizer.nvme_path.
// rebase_job_paths makes each relative one base_dir/path (InputError unless base_dir is
// absolute); require_absolute_paths throws ConfigError naming the JSON key of each relative one.
void rebase_job_paths(JobConfig& cfg, const std::string& base_dir);
void require_absolute_paths(const JobConfig& cfg);
// `path` when absolute, else base_dir/path (lexically normalised; glob characters kept).
std::string rebase_path(const std::string& path, const std::string& base_dir);

// A model section on its own, as a checkpoint manifest's copy of the resolved job holds it
// (an init_from directory's config.json is not read: the section is complete). Validated, with
// padded_vocab_size derived. Throws ConfigError naming `source`.
ModelConfig parse_model_config(const nlohmann::json& model, const std::string& source);

// Reads and parses a job file. A missing or unreadable file is an InputError naming it.
ParsedJob load_job_file(const std::string& path);

// Resolves the batch triangle for `world_size` ranks with DeepSpeed's derivation and checks, and
// (re)computes every derived value. Idempotent. Throws ConfigError.
void resolve_job(JobConfig& cfg, int world_size);

// ConfigError listing each option that is recognised but not implemented yet in zerod. With
// running false (`zerod check`), options whose plan can be shown without running them (pipeline
// parallelism) pass.
void check_supported(const JobConfig& cfg, bool running = true);

// The fully resolved config: every field with its default or derived value, in the job file's
// own format (derived values under "resolved"). parse_job_text(job_to_json(c).dump()) == c.
nlohmann::json job_to_json(const JobConfig& cfg);

}  // namespace zerod
