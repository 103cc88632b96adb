#include "engine/config/json_reader.h"

#include <atomic>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>

namespace zerod::config {

namespace {
constexpr size_t kMaxPathBytes = 4 * kMaxQuotedBytes;
}  // namespace

void Problems::error(std::string_view path, std::string_view message) {
  errors.push_back(path.empty() ? std::string(message)
                                : fmt::format("{}: {}", clip_input(path, kMaxPathBytes), message));
}

void Problems::warn(std::string_view path, std::string_view message) {
  warnings.push_back(path.empty()
                         ? std::string(message)
                         : fmt::format("{}: {}", clip_input(path, kMaxPathBytes), message));
}

std::string join_path(std::string_view parent, std::string_view key) {
  if (parent.empty()) return clip_input(key);
  return fmt::format("{}.{}", parent, clip_input(key));
}

namespace {
std::atomic<bool> g_quote_file_values{true};
}  // namespace

void set_quote_file_values(bool quote) {
  g_quote_file_values = quote;
}
bool quote_file_values() {
  return g_quote_file_values;
}

std::string Problems::quote(const Json& v) const {
  return quote_values ? show(v) : "(value not shown)";
}

std::string show(const Json& v) {
  // The parsers bound the depth (input_limits.h), so dump() recursion is bounded too.
  return clip_input(v.dump());
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];  // row[i-1][j-1]
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];  // row[i-1][j]
      const size_t sub = diag + (a[i - 1] == b[j - 1] ? 0 : 1);
      row[j] = std::min({up + 1, row[j - 1] + 1, sub});
      diag = up;
    }
  }
  return row[b.size()];
}

namespace {
// True when every character of `small` appears in `big` in order.
bool is_subsequence(std::string_view small, std::string_view big) {
  size_t i = 0;
  for (char c : big) {
    if (i < small.size() && small[i] == c) ++i;
  }
  return i == small.size();
}

// Edit distance, except that a key which is a substantial part of the other with a piece left out
// or added ("warmup_steps" / "warmup_num_steps") counts as one edit.
// Letter case is ignored, except that a key differing only in case counts as one edit.
size_t typo_distance(std::string_view key_in, std::string_view candidate_in) {
  std::string key(key_in), candidate(candidate_in);
  for (char& c : key) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (char& c : candidate) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (key == candidate) return key_in == candidate_in ? 0 : 1;
  const size_t d = edit_distance(key, candidate);
  const std::string_view small = key.size() <= candidate.size() ? key : candidate;
  const std::string_view big = key.size() <= candidate.size() ? candidate : key;
  if (small.size() >= 4 && small.size() * 2 >= big.size() && is_subsequence(small, big)) {
    return std::min<size_t>(d, 1);
  }
  return d;
}
}  // namespace

std::string closest_match(std::string_view key, const std::vector<std::string>& candidates) {
  const size_t limit = std::max<size_t>(2, key.size() / 3);
  std::string best;
  size_t best_d = limit + 1;
  for (const std::string& c : candidates) {
    // A key more than twice as long as c is at least len(key) - len(c) edits away (the
    // "piece left out" rule needs half of it): skip the quadratic distance of a huge key.
    if (c.size() * 2 < key.size() && key.size() - c.size() > limit) continue;
    const size_t d = typo_distance(key, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

std::string IntRange::describe() const {
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  if (listed && max - min <= 16) {
    std::string out;
    for (int64_t v = min; v <= max; ++v) out += (v == min ? "" : ", ") + std::to_string(v);
    return out;
  }
  if (min != kMin && max != kMax) return fmt::format("{} to {}", min, max);
  if (min != kMin) return fmt::format(">= {}", min);
  if (max != kMax) return fmt::format("<= {}", max);
  return "any integer";
}

bool RealRange::contains(double v) const {
  if (!std::isfinite(v)) return false;
  if (min_open ? !(v > min) : !(v >= min)) return false;
  if (max_open ? !(v < max) : !(v <= max)) return false;
  return true;
}

std::string RealRange::describe() const {
  const bool has_min = std::isfinite(min);
  const bool has_max = std::isfinite(max);
  if (has_min && has_max) {
    return fmt::format("{}{}, {}{}", min_open ? "(" : "[", min, max, max_open ? ")" : "]");
  }
  if (has_min) return fmt::format("{} {}", min_open ? ">" : ">=", min);
  if (has_max) return fmt::format("{} {}", max_open ? "<" : "<=", max);
  return "any finite number";
}

ObjectReader::ObjectReader(const Json& obj, std::string path, Problems& problems)
    : obj_(obj), path_(std::move(path)), problems_(problems) {}

const Json* ObjectReader::find(std::string_view key) {
  if (std::find(known_.begin(), known_.end(), key) == known_.end()) known_.emplace_back(key);
  if (!obj_.is_object()) return nullptr;
  auto it = obj_.find(std::string(key));
  return it == obj_.end() ? nullptr : &*it;
}

void ObjectReader::type_error(std::string_view path, std::string_view expected, const Json& got) {
  std::string msg = fmt::format("expected {}, got {}", expected, problems_.quote(got));
  if (got.is_string() && got.get_ref<const std::string&>() == "auto") {
    msg += " (\"auto\" is a placeholder the Hugging Face Trainer fills in; zerod needs the value)";
  }
  problems_.error(path, msg);
}

bool ObjectReader::value_to_int(const Json& v, std::string_view path, int64_t& out,
                                const IntRange& range) {
  int64_t value = 0;
  if (v.is_number_integer() && !v.is_number_unsigned()) {
    value = v.get<int64_t>();
  } else if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      problems_.error(path, fmt::format("{} is out of range (allowed: {})", problems_.quote(v),
                                        range.describe()));
      return false;
    }
    value = static_cast<int64_t>(u);
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || std::floor(d) != d) {
      type_error(path, "an integer", v);
      return false;
    }
    // 2^63 is exactly representable; anything at or beyond it does not fit.
    if (d >= 9223372036854775808.0 || d < -9223372036854775808.0) {
      problems_.error(path, fmt::format("{} is out of range (allowed: {})", problems_.quote(v),
                                        range.describe()));
      return false;
    }
    value = static_cast<int64_t>(d);
  } else {
    type_error(path, "an integer", v);
    return false;
  }
  if (value < range.min || value > range.max) {
    problems_.error(path, fmt::format("{} is out of range (allowed: {})", problems_.quote(v),
                                      range.describe()));
    return false;
  }
  out = value;
  return true;
}

bool ObjectReader::value_to_real(const Json& v, std::string_view path, double& out,
                                 const RealRange& range) {
  if (!v.is_number()) {
    type_error(path, "a number", v);
    return false;
  }
  const double d = v.get<double>();
  if (!range.contains(d)) {
    problems_.error(path, fmt::format("{} is out of range (allowed: {})", problems_.quote(v),
                                      range.describe()));
    return false;
  }
  out = d;
  return true;
}

bool ObjectReader::read_bool(std::string_view key, bool& out) {
  const Json* v = find(key);
  if (v == nullptr) return false;
  if (!v->is_boolean()) {
    type_error(path_of(key), "a boolean", *v);
    return false;
  }
  out = v->get<bool>();
  return true;
}

bool ObjectReader::read_int(std::string_view key, int64_t& out, const IntRange& range) {
  const Json* v = find(key);
  if (v == nullptr) return false;
  return value_to_int(*v, path_of(key), out, range);
}

bool ObjectReader::read_int(std::string_view key, int& out, const IntRange& range) {
  IntRange r = range;
  r.min = std::max<int64_t>(r.min, std::numeric_limits<int>::min());
  r.max = std::min<int64_t>(r.max, std::numeric_limits<int>::max());
  int64_t wide = 0;
  if (!read_int(key, wide, r)) return false;
  out = static_cast<int>(wide);
  return true;
}

bool ObjectReader::read_u64(std::string_view key, uint64_t& out) {
  const Json* v = find(key);
  if (v == nullptr) return false;
  if (v->is_number_unsigned()) {
    out = v->get<uint64_t>();
    return true;
  }
  int64_t value = 0;
  if (!value_to_int(*v, path_of(key), value, at_least(0))) return false;
  out = static_cast<uint64_t>(value);
  return true;
}

bool ObjectReader::read_real(std::string_view key, double& out, const RealRange& range) {
  const Json* v = find(key);
  if (v == nullptr) return false;
  return value_to_real(*v, path_of(key), out, range);
}

bool ObjectReader::read_string(std::string_view key, std::string& out, bool allow_empty) {
  const Json* v = find(key);
  if (v == nullptr) return false;
  if (!v->is_string()) {
    type_error(path_of(key), "a string", *v);
    return false;
  }
  const std::string& s = v->get_ref<const std::string&>();
  if (!allow_empty && s.empty()) {
    problems_.error(path_of(key), "must not be empty");
    return false;
  }
  out = s;
  return true;
}

bool ObjectReader::read_opt_int(std::string_view key, std::optional<int64_t>& out,
                                const IntRange& range) {
  const Json* v = find(key);
  if (v == nullptr) return false;
  if (v->is_null()) {
    out.reset();
    return true;
  }
  int64_t value = 0;
  if (!value_to_int(*v, path_of(key), value, range)) return false;
  out = value;
  return true;
}

bool ObjectReader::read_opt_bool(std::string_view key, std::optional<bool>& out) {
  const Json* v = find(key);
  if (v == nullptr) return false;
  if (v->is_null()) {
    out.reset();
    return true;
  }
  if (!v->is_boolean()) {
    type_error(path_of(key), "a boolean or null", *v);
    return false;
  }
  out = v->get<bool>();
  return true;
}

bool ObjectReader::read_opt_string(std::string_view key, std::optional<std::string>& out) {
  const Json* v = find(key);
  if (v == nullptr) return false;
  if (v->is_null()) {
    out.reset();
    return true;
  }
  if (!v->is_string()) {
    type_error(path_of(key), "a string or null", *v);
    return false;
  }
  if (v->get_ref<const std::string&>().empty()) {
    problems_.error(path_of(key), "must not be empty (use null for none)");
    return false;
  }
  out = v->get<std::string>();
  return true;
}

namespace {
bool equal_ignoring_case(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}
}  // namespace

bool ObjectReader::read_choice(std::string_view key, size_t& index,
                               const std::vector<std::string>& choices, bool case_insensitive) {
  const Json* v = find(key);
  if (v == nullptr) return false;
  if (!v->is_string()) {
    type_error(path_of(key), "a string", *v);
    return false;
  }
  const std::string& s = v->get_ref<const std::string&>();
  for (size_t i = 0; i < choices.size(); ++i) {
    if (case_insensitive ? equal_ignoring_case(s, choices[i]) : s == choices[i]) {
      index = i;
      return true;
    }
  }
  std::string allowed;
  for (const std::string& c : choices) allowed += (allowed.empty() ? "" : ", ") + c;
  problems_.error(path_of(key),
                  fmt::format("{} is not allowed (allowed: {})", problems_.quote(*v), allowed));
  return false;
}

const Json* ObjectReader::read_object(std::string_view key) {
  const Json* v = find(key);
  if (v == nullptr || v->is_null()) return nullptr;
  if (!v->is_object()) {
    type_error(path_of(key), "an object", *v);
    return nullptr;
  }
  return v;
}

void ObjectReader::expect_default(std::string_view key, const Json& default_value,
                                  std::string_view allowed) {
  const Json* v = find(key);
  if (v == nullptr || *v == default_value) return;
  problems_.error(path_of(key), fmt::format("{} is not supported by zerod (only {})",
                                            problems_.quote(*v), allowed));
}

void ObjectReader::accept_no_effect(std::string_view key, std::string_view kind) {
  const Json* v = find(key);
  if (v == nullptr) return;
  bool ok = true;
  if (kind == "boolean")
    ok = v->is_boolean();
  else if (kind == "integer")
    ok = v->is_number_integer() || (v->is_number_float() && std::isfinite(v->get<double>()) &&
                                    std::floor(v->get<double>()) == v->get<double>());
  else if (kind == "number")
    ok = v->is_number();
  if (!ok) {
    type_error(path_of(key), kind == "integer" ? "an integer" : fmt::format("a {}", kind), *v);
    return;
  }
  problems_.warn(path_of(key), "DeepSpeed option that has no effect in zerod; ignored");
}

void ObjectReader::finish(std::string_view valid_for, const std::vector<std::string>& not_listed) {
  if (!obj_.is_object()) return;
  std::vector<std::string> listed;
  for (const std::string& k : known_) {
    if (std::find(not_listed.begin(), not_listed.end(), k) == not_listed.end()) listed.push_back(k);
  }
  const std::string valid =
      valid_for.empty() ? "" : fmt::format(" (valid {}: {})", valid_for, fmt::join(listed, ", "));
  for (auto it = obj_.begin(); it != obj_.end(); ++it) {
    if (std::find(known_.begin(), known_.end(), it.key()) != known_.end()) continue;
    const std::string suggestion = closest_match(it.key(), known_);
    if (suggestion.empty()) {
      problems_.error(path_of(it.key()), "unknown key" + valid);
    } else {
      problems_.error(path_of(it.key()),
                      fmt::format("unknown key; did you mean '{}'?{}", suggestion, valid));
    }
  }
}

}  // namespace zerod::config
