// Typed, strict reading of one JSON object of a job file. Every read names the key it knows;
// finish() then reports each key nobody asked for as unknown, with the closest known key.
// Problems are collected, not thrown, so one run reports everything wrong with a file.
//
// Message forms (the JSON path first, then what is wrong):
//   zero_optimization.stagee: unknown key; did you mean 'stage'?
//   zero_optimization.stage: 4 is out of range (allowed: 0, 1, 2, 3)
//   train.steps: expected an integer, got 5.5
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/config/input_limits.h"  // json_depth_ok, clip_input: bounds on user input

namespace zerod::config {

using Json = nlohmann::json;

// Errors and warnings found while reading a job file, each "path: message" (a path longer than
// 4 x kMaxQuotedBytes is clipped: it holds keys of the file).
struct Problems {
  std::vector<std::string> errors;
  std::vector<std::string> warnings;
  // false: messages say "(value not shown)" instead of quoting a value (a file the daemon read
  // for a job, which its client may not be able to read: set_quote_file_values).
  bool quote_values = true;

  void error(std::string_view path, std::string_view message);
  void warn(std::string_view path, std::string_view message);
  // show(v), or "(value not shown)" when !quote_values.
  std::string quote(const nlohmann::json& v) const;
};

// zerod serve turns this off: the values of files a job makes the daemon read (a Hugging Face
// directory's config.json under model.init_from) are then not quoted in the job's errors. The
// job file's own values are always quoted (its client sent them). Set once at start-up.
void set_quote_file_values(bool quote);
bool quote_file_values();

// "a.b" + "c" -> "a.b.c"; "" + "c" -> "c". For messages: a long key is clipped (clip_input).
std::string join_path(std::string_view parent, std::string_view key);

// A JSON value as it appears in messages: compact, strings quoted; a long one clipped to a
// prefix and its length (clip_input).
std::string show(const Json& v);

// Levenshtein distance (insert, delete, substitute: cost 1 each).
size_t edit_distance(std::string_view a, std::string_view b);
// The candidate closest to `key` when it is close enough to be a plausible typo
// (distance <= max(2, len(key) / 3), where a key that is most of a candidate with a piece left
// out or added counts as distance 1); ties go to the earlier candidate. "" when none is.
std::string closest_match(std::string_view key, const std::vector<std::string>& candidates);

// The allowed integers [min, max]. `listed` prints the values one by one ("0, 1, 2, 3").
struct IntRange {
  int64_t min = std::numeric_limits<int64_t>::min();
  int64_t max = std::numeric_limits<int64_t>::max();
  bool listed = false;
  std::string describe() const;
};
inline IntRange at_least(int64_t min) {
  return IntRange{min, std::numeric_limits<int64_t>::max()};
}
inline IntRange int_between(int64_t min, int64_t max) {
  return IntRange{min, max};
}
inline IntRange one_of_ints(int64_t min, int64_t max) {
  return IntRange{min, max, true};
}

// The allowed reals: min and max with open or closed ends (infinite bounds print as one-sided).
struct RealRange {
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  bool min_open = false;
  bool max_open = false;
  bool contains(double v) const;
  std::string describe() const;
};
inline RealRange real_at_least(double min) {
  return RealRange{min};
}
inline RealRange real_above(double min) {
  return RealRange{min, std::numeric_limits<double>::infinity(), true, false};
}
// [min, max] or [min, max) when max_open.
inline RealRange real_between(double min, double max, bool max_open = false) {
  return RealRange{min, max, false, max_open};
}

class ObjectReader {
 public:
  // `obj` must outlive the reader. A non-object `obj` reads as empty (the caller reports it).
  ObjectReader(const Json& obj, std::string path, Problems& problems);

  const std::string& path() const { return path_; }
  std::string path_of(std::string_view key) const { return join_path(path_, key); }
  Problems& problems() { return problems_; }

  // Marks `key` as known; the value when present (null included), nullptr when absent.
  const Json* find(std::string_view key);
  bool has(std::string_view key) { return find(key) != nullptr; }

  // Each read marks the key known and, when present and valid, writes `out` and returns true.
  // A wrong type or a value out of range is recorded as an error and leaves `out` unchanged.
  bool read_bool(std::string_view key, bool& out);
  bool read_int(std::string_view key, int64_t& out, const IntRange& range);
  bool read_int(std::string_view key, int& out, const IntRange& range);
  bool read_u64(std::string_view key, uint64_t& out);
  bool read_real(std::string_view key, double& out, const RealRange& range);
  bool read_string(std::string_view key, std::string& out, bool allow_empty = true);
  // null -> nullopt.
  bool read_opt_int(std::string_view key, std::optional<int64_t>& out, const IntRange& range);
  bool read_opt_bool(std::string_view key, std::optional<bool>& out);
  bool read_opt_string(std::string_view key, std::optional<std::string>& out);
  // One of `choices` (compared case-insensitively when asked); the canonical spelling is returned
  // through `index`.
  bool read_choice(std::string_view key, size_t& index, const std::vector<std::string>& choices,
                   bool case_insensitive);
  // The nested object, or nullptr when absent or null; a non-object value is an error.
  const Json* read_object(std::string_view key);

  // Keys DeepSpeed knows that zerod accepts only at DeepSpeed's default value (the feature behind
  // any other value is not supported). `allowed` is shown in the message ("false", "null", ...).
  void expect_default(std::string_view key, const Json& default_value, std::string_view allowed);
  // Keys DeepSpeed knows that tune PyTorch internals and mean nothing here: accepted when of the
  // right kind ("boolean", "integer", "number", "any"), with a warning.
  void accept_no_effect(std::string_view key, std::string_view kind);

  // Reports every key of the object that no read asked for; with `valid_for` ("for SGD"), each
  // message also lists the keys that were asked for ("valid for SGD: lr, momentum, ..."), less
  // `not_listed` (keys read only to refuse them).
  void finish(std::string_view valid_for = {}, const std::vector<std::string>& not_listed = {});

  // Value checks shared with callers that read values by hand.
  bool value_to_int(const Json& v, std::string_view path, int64_t& out, const IntRange& range);
  bool value_to_real(const Json& v, std::string_view path, double& out, const RealRange& range);
  void type_error(std::string_view path, std::string_view expected, const Json& got);

 private:
  const Json& obj_;
  std::string path_;
  Problems& problems_;
  std::vector<std::string> known_;
};

}  // namespace zerod::config
