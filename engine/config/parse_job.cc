// Job file text -> JobConfig: JSON with comments, duplicate keys rejected (as DeepSpeed does),
// the top-level keys, then each section's reader; all problems reported together.
#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "engine/config/parse.h"
#include "engine/config/sections.h"

namespace zerod {

namespace {

using config::Json;
using config::ObjectReader;
using config::Problems;

// Position of byte offset `byte` (1-based, as nlohmann counts) as "line L, column C".
std::string position_of(std::string_view text, size_t byte) {
  size_t line = 1, column = 0;
  for (size_t i = 0; i < byte && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 0;
    } else {
      ++column;
    }
  }
  return fmt::format("line {}, column {}", line, column);
}

// nlohmann's syntax error, its "last read: '...'" token (which can be the whole of a long string)
// cut to a prefix and its length.
std::string clip_parse_error(std::string detail) {
  const std::string kLastRead = "last read: '";
  const size_t at = detail.find(kLastRead);
  if (at != std::string::npos) {
    const size_t start = at + kLastRead.size();
    std::string token = detail.substr(start);
    if (!token.empty() && token.back() == '\'') token.pop_back();
    detail = detail.substr(0, start) + config::clip_input(token, 64) + "'";
  }
  return config::clip_input(detail, 4 * config::kMaxQuotedBytes);
}

// Parses JSON allowing // and /* */ comments. Duplicate keys are problems (DeepSpeed rejects them
// too); a syntax error, or nesting deeper than config::kMaxJsonDepth, throws ConfigError at once
// (the depth before any tree is built: building, printing or destroying one recurses per level).
Json parse_json(std::string_view text, const std::string& source, Problems& problems) {
  config::check_json_depth(text, source);
  struct Frame {
    bool is_object;
    std::string key;
    std::set<std::string> seen;
  };
  std::vector<Frame> stack;
  auto callback = [&](int /*depth*/, Json::parse_event_t event, Json& parsed) -> bool {
    switch (event) {
      case Json::parse_event_t::object_start:
        stack.push_back({true, {}, {}});
        break;
      case Json::parse_event_t::array_start:
        stack.push_back({false, {}, {}});
        break;
      case Json::parse_event_t::object_end:
      case Json::parse_event_t::array_end:
        if (!stack.empty()) stack.pop_back();
        break;
      case Json::parse_event_t::key: {
        if (stack.empty()) break;
        std::string key = parsed.get<std::string>();
        if (!stack.back().seen.insert(key).second) {
          std::string path;
          for (size_t i = 0; i + 1 < stack.size(); ++i) {
            path = stack[i].is_object ? config::join_path(path, stack[i].key) : path + "[]";
          }
          problems.error(config::join_path(path, key),
                         "duplicate key (DeepSpeed rejects duplicate keys too)");
        }
        stack.back().key = std::move(key);
        break;
      }
      case Json::parse_event_t::value:
        break;
    }
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/true,
                       /*ignore_comments=*/true);
  } catch (const Json::parse_error& e) {
    std::string detail = e.what();
    // "[json.exception.parse_error.101] parse error at line 3, column 5: ..." -> after "] ".
    const size_t bracket = detail.find("] ");
    if (bracket != std::string::npos) detail = detail.substr(bracket + 2);
    detail = clip_parse_error(std::move(detail));
    if (detail.find("line ") == std::string::npos) {
      detail = fmt::format("{} (at {})", detail, position_of(text, e.byte));
    }
    throw ConfigError({fmt::format("invalid JSON: {}", detail)}, source);
  }
}

void read_top_level_scalars(ObjectReader& top, JobConfig& cfg) {
  // The batch sizes must fit the engine's int (the micro-batch sizes buffers and kernels): a
  // micro-batch of 2^40 would otherwise train as a cast's 0.
  const config::IntRange batch = config::int_between(1, config::kMaxBatchSize);
  top.read_opt_int("train_batch_size", cfg.train_batch_size, batch);
  top.read_opt_int("train_micro_batch_size_per_gpu", cfg.train_micro_batch_size_per_gpu, batch);
  top.read_opt_int("gradient_accumulation_steps", cfg.gradient_accumulation_steps, batch);
  std::optional<int64_t> steps_per_print;
  if (top.read_opt_int("steps_per_print", steps_per_print, config::at_least(0))) {
    cfg.steps_per_print = steps_per_print.value_or(0);  // null: never (DeepSpeed's None)
  }
  top.read_bool("wall_clock_breakdown", cfg.wall_clock_breakdown);
  top.read_bool("dump_state", cfg.dump_state);
  top.read_real("gradient_clipping", cfg.gradient_clipping, config::real_at_least(0.0));
  top.read_bool("prescale_gradients", cfg.prescale_gradients);
  top.read_real("gradient_predivide_factor", cfg.gradient_predivide_factor,
                config::real_above(0.0));
}

}  // namespace

ParsedJob parse_job_text(std::string_view text, const std::string& source_name,
                         const std::string& base_dir) {
  Problems problems;
  Json root = parse_json(text, source_name, problems);
  // model.init_from first: the model section reads the config.json of the directory it names.
  if (!base_dir.empty() && root.is_object() && root.contains("model") &&
      root["model"].is_object() && root["model"].contains("init_from") &&
      root["model"]["init_from"].is_string()) {
    Json& from = root["model"]["init_from"];
    from = rebase_path(from.get<std::string>(), base_dir);
  }
  if (!root.is_object()) {
    throw ConfigError({fmt::format("expected a JSON object at the top level, got {}",
                                   root.is_null() ? std::string("null") : config::show(root))},
                      source_name);
  }

  ParsedJob out;
  JobConfig& cfg = out.config;
  cfg.source = source_name;
  ObjectReader top(root, "", problems);
  read_top_level_scalars(top, cfg);
  config::read_optimizer(top, cfg);
  config::read_scheduler(top, cfg);
  config::read_precision(top, cfg);
  config::read_zero(top, cfg);
  config::read_aio(top, cfg);
  config::read_runtime_sections(top, cfg);
  config::read_communication_compression(top, cfg);
  config::read_elasticity(top, cfg);
  config::read_snapshot(top, cfg);
  config::read_parallelism(top, cfg);
  config::read_model(top, cfg);
  config::read_data(top, cfg);
  config::read_train(top, cfg);
  config::read_unsupported(top);

  config::validate_job(cfg, problems);
  config::derive_values(cfg);
  config::validate_derived(cfg, problems);
  config::read_resolved(top, cfg);
  config::validate_elasticity(cfg, root.contains("resolved"), problems);
  top.finish();

  if (!problems.errors.empty()) throw ConfigError(std::move(problems.errors), source_name);
  out.warnings = std::move(problems.warnings);
  if (!base_dir.empty()) rebase_job_paths(cfg, base_dir);
  return out;
}

ParsedJob load_job_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    ZD_THROW_INPUT("cannot read job file '{}': it is a directory", path);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    ZD_THROW_INPUT("cannot read job file '{}': {}", path,
                   err != 0 ? std::strerror(err) : "cannot open");
  }
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) ZD_THROW_INPUT("cannot read job file '{}': read error", path);
  return parse_job_text(buf.str(), path);
}

}  // namespace zerod
