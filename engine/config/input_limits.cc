#include "engine/config/input_limits.h"

#include <fmt/format.h>

#include <algorithm>

#include "engine/config/config_error.h"
#include "engine/config/json_reader.h"

namespace zerod::config {

std::string json_depth_problem(std::string_view text, int limit) {
  const size_t n = text.size();
  int depth = 0, deepest = 0;
  size_t past = std::string_view::npos;  // where the depth first went past the limit
  for (size_t i = 0; i < n; ++i) {
    const char c = text[i];
    if (c == '"') {  // a string: to its closing quote, escapes skipped
      for (++i; i < n && text[i] != '"'; ++i) {
        if (text[i] == '\\') ++i;
      }
    } else if (c == '/' && i + 1 < n && text[i + 1] == '/') {  // a line comment
      const size_t end = text.find('\n', i + 2);
      i = end == std::string_view::npos ? n : end;
    } else if (c == '/' && i + 1 < n && text[i + 1] == '*') {  // a block comment
      const size_t end = text.find("*/", i + 2);
      i = end == std::string_view::npos ? n : end + 1;
    } else if (c == '[' || c == '{') {
      ++depth;
      deepest = std::max(deepest, depth);
      if (depth > limit && past == std::string_view::npos) past = i;
    } else if (c == ']' || c == '}') {
      if (depth > 0) --depth;  // an unmatched one is the parser's syntax error
    }
  }
  if (past == std::string_view::npos) return "";
  size_t line = 1, column = 1;
  for (size_t i = 0; i < past; ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return fmt::format(
      "JSON nests {} levels deep (past the limit at line {}, column {}); at most {} are allowed",
      deepest, line, column, limit);
}

bool json_depth_ok(std::string_view text, std::string_view path, Problems& problems, int limit) {
  const std::string problem = json_depth_problem(text, limit);
  if (problem.empty()) return true;
  problems.error(path, problem);
  return false;
}

void check_json_depth(std::string_view text, const std::string& source, int limit) {
  std::string problem = json_depth_problem(text, limit);
  if (!problem.empty()) throw ConfigError({std::move(problem)}, source);
}

std::string clip_input(std::string_view text, size_t max) {
  if (text.size() <= max) return std::string(text);
  size_t cut = max;
  // Never end inside a UTF-8 character: back up over its continuation bytes.
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return fmt::format("{}... ({} bytes)", text.substr(0, cut), text.size());
}

std::string json_error_without_input(std::string_view what) {
  std::string m(what);
  if (m.rfind("[json.exception.", 0) == 0) {
    const size_t close = m.find("] ");
    if (close != std::string::npos) m.erase(0, close + 2);
  }
  const std::string kLastRead = "; last read: '";
  const size_t at = m.find(kLastRead);
  if (at == std::string::npos) return m;
  // The token may hold anything, quotes included: what follows it is "; expected ..." or nothing.
  const size_t expected = m.rfind("'; expected ");
  return m.substr(0, at) +
         (expected != std::string::npos && expected > at ? m.substr(expected + 1) : "");
}

}  // namespace zerod::config
