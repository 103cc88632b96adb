#include "engine/config/config_error.h"

namespace zerod {

namespace {
std::string join_problems(const std::vector<std::string>& problems, const std::string& source) {
  std::string out;
  for (const std::string& p : problems) {
    if (!out.empty()) out += '\n';
    if (!source.empty()) out += source + ": ";
    out += p;
  }
  if (out.empty()) out = source.empty() ? "invalid job config" : source + ": invalid job config";
  return out;
}
}  // namespace

ConfigError::ConfigError(std::vector<std::string> problems, const std::string& source)
    : InputError(join_problems(problems, source)), problems_(std::move(problems)) {}

}  // namespace zerod
