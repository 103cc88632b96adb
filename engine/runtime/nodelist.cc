#include "engine/runtime/nodelist.h"

#include <fmt/format.h>

#include <cctype>

#include "core/error.h"

namespace zerod {
namespace {

constexpr size_t kMaxHosts = 1 << 20;  // a list that expands further is surely a mistake

[[noreturn]] void bad(const std::string& list, const std::string& why) {
  ZD_THROW_INPUT("SLURM_JOB_NODELIST '{}': {}", list, why);
}

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

// "01-03,7" -> {"01","02","03","7"}.
std::vector<std::string> expand_ranges(const std::string& body, const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= body.size()) {
    size_t comma = body.find(',', start);
    if (comma == std::string::npos) comma = body.size();
    const std::string item = body.substr(start, comma - start);
    const size_t dash = item.find('-');
    if (dash == std::string::npos) {
      if (!all_digits(item)) bad(list, fmt::format("'[{}]': '{}' is not a number", body, item));
      out.push_back(item);
    } else {
      const std::string lo = item.substr(0, dash);
      const std::string hi = item.substr(dash + 1);
      if (!all_digits(lo) || !all_digits(hi) || lo.size() > 9 || hi.size() > 9)
        bad(list, fmt::format("'[{}]': '{}' is not a range like 01-04", body, item));
      const long a = std::stol(lo);
      const long b = std::stol(hi);
      if (b < a) bad(list, fmt::format("'[{}]': the range '{}' runs backwards", body, item));
      if (static_cast<size_t>(b - a) + out.size() >= kMaxHosts)
        bad(list, fmt::format("'[{}]' expands to too many hosts", body));
      for (long v = a; v <= b; ++v) out.push_back(fmt::format("{:0{}}", v, lo.size()));
    }
    start = comma + 1;
  }
  return out;
}

// One host expression ("rack[1-2]-n[8-9]") -> its hosts (cartesian product of the groups).
void expand_entry(const std::string& entry, const std::string& list,
                  std::vector<std::string>& hosts) {
  std::vector<std::string> partial{""};
  size_t i = 0;
  while (i < entry.size()) {
    const size_t open = entry.find('[', i);
    const std::string literal = entry.substr(i, open == std::string::npos ? open : open - i);
    if (literal.find(']') != std::string::npos) bad(list, "unbalanced ']'");
    for (auto& p : partial) p += literal;
    if (open == std::string::npos) break;
    const size_t close = entry.find(']', open);
    if (close == std::string::npos) bad(list, "unbalanced '['");
    const std::vector<std::string> values =
        expand_ranges(entry.substr(open + 1, close - open - 1), list);
    if (partial.size() * values.size() > kMaxHosts) bad(list, "expands to too many hosts");
    std::vector<std::string> next;
    next.reserve(partial.size() * values.size());
    for (const auto& p : partial)
      for (const auto& v : values) next.push_back(p + v);
    partial = std::move(next);
    i = close + 1;
  }
  for (auto& p : partial) {
    if (p.empty()) bad(list, "empty host name");
    hosts.push_back(std::move(p));
  }
}

}  // namespace

std::vector<std::string> expand_slurm_nodelist(const std::string& list) {
  if (list.empty()) bad(list, "empty list");
  std::vector<std::string> hosts;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    const char c = i < list.size() ? list[i] : ',';
    if (c == '[') {
      if (++depth > 1) bad(list, "nested '['");
    } else if (c == ']') {
      if (--depth < 0) bad(list, "unbalanced ']'");
    } else if (c == ',' && depth == 0) {
      const std::string entry = list.substr(start, i - start);
      if (entry.empty()) bad(list, "empty host name");
      expand_entry(entry, list, hosts);
      if (hosts.size() > kMaxHosts) bad(list, "expands to too many hosts");
      start = i + 1;
    }
  }
  if (depth != 0) bad(list, "unbalanced '['");
  return hosts;
}

}  // namespace zerod
