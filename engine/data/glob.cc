#include "engine/data/glob.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "core/error.h"

namespace zerod {

namespace {

// Frees a glob_t on scope exit.
struct GlobResult {
  glob_t g{};
  ~GlobResult() { globfree(&g); }
};

// Why a pattern with no match matched nothing, as far as we can tell cheaply.
std::string no_match_reason(const std::string& pattern) {
  const std::filesystem::path dir = std::filesystem::path(pattern).parent_path();
  const bool dir_has_wildcard = dir.string().find_first_of("*?[") != std::string::npos;
  std::error_code ec;
  if (!dir.empty() && !dir_has_wildcard && !std::filesystem::is_directory(dir, ec))
    return fmt::format(" (directory '{}' does not exist)", dir.string());
  return "";
}

}  // namespace

std::vector<std::string> expand_globs(const std::vector<std::string>& patterns,
                                      std::string_view what) {
  std::vector<std::string> files;
  for (const std::string& pattern : patterns) {
    if (pattern.empty()) ZD_THROW_INPUT("{}: an empty string is not a file pattern", what);
    GlobResult result;
    const int rc = ::glob(pattern.c_str(), 0, nullptr, &result.g);
    if (rc == GLOB_NOMATCH) {
      ZD_THROW_INPUT("{}: no file matches '{}'{}; expected at least one llm.c .bin token shard",
                     what, pattern, no_match_reason(pattern));
    }
    if (rc == GLOB_ABORTED)
      ZD_THROW_INPUT("{}: cannot read a directory while expanding '{}'", what, pattern);
    if (rc == GLOB_NOSPACE) ZD_THROW("glob('{}'): out of memory", pattern);
    if (rc != 0) ZD_THROW("glob('{}') failed with code {}", pattern, rc);
    for (size_t i = 0; i < result.g.gl_pathc; ++i) files.emplace_back(result.g.gl_pathv[i]);
  }
  std::sort(files.begin(), files.end());
  files.erase(std::unique(files.begin(), files.end()), files.end());
  return files;
}

}  // namespace zerod
