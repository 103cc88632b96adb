// Helpers shared by the config tests: build job texts and collect ConfigError problems.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/config/parse.h"

namespace zerod::testing_config {

// The smallest valid job: one micro-batch size and a step count.
inline nlohmann::json minimal_job() {
  return nlohmann::json{{"train_micro_batch_size_per_gpu", 2}, {"train", {{"steps", 10}}}};
}

// minimal_job() with `patch` merged in (RFC 7386 merge patch: objects merge, null removes).
inline std::string job_with(const nlohmann::json& patch) {
  nlohmann::json j = minimal_job();
  j.merge_patch(patch);
  return j.dump();
}

inline ParsedJob parse(const std::string& text) {
  return parse_job_text(text, "test.json");
}

// The problems parse_job_text reports for `text`; empty when it parses.
inline std::vector<std::string> problems_of(const std::string& text) {
  try {
    parse_job_text(text, "test.json");
  } catch (const ConfigError& e) {
    return e.problems();
  }
  return {};
}

// The problems resolve_job reports for `text` on `world` ranks; empty when it resolves.
inline std::vector<std::string> resolve_problems(const std::string& text, int world) {
  try {
    ParsedJob job = parse(text);
    resolve_job(job.config, world);
  } catch (const ConfigError& e) {
    return e.problems();
  }
  return {};
}

inline bool contains(const std::vector<std::string>& lines, const std::string& needle) {
  return std::any_of(lines.begin(), lines.end(),
                     [&](const std::string& l) { return l.find(needle) != std::string::npos; });
}

inline std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

}  // namespace zerod::testing_config
