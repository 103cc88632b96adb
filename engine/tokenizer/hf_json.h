// Reading tokenizer.json with errors that name the JSON path: "tokenizer.json: /model/merges/3:
// expected a string or a list of two strings, found number".
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

#include "core/error.h"

namespace zerod::tokenizer {

struct JsonAt {
  const nlohmann::json& j;
  std::string path;  // "/model/vocab"
  const std::string& file;

  // A member that must be there.
  JsonAt operator[](std::string_view key) const {
    expect_object();
    const auto it = j.find(key);
    if (it == j.end()) {
      ZD_THROW_INPUT("{}: {}: missing key \"{}\"", file, path.empty() ? "/" : path, key);
    }
    return {*it, path + "/" + std::string(key), file};
  }
  JsonAt at(size_t i) const { return {j.at(i), path + "/" + std::to_string(i), file}; }
  bool has(std::string_view key) const { return j.is_object() && j.contains(key); }
  // A member that may be absent or null.
  bool has_value(std::string_view key) const { return has(key) && !j.at(key).is_null(); }
  bool is_null() const { return j.is_null(); }

  void expect_object() const {
    if (!j.is_object()) fail("expected an object");
  }
  void expect_array() const {
    if (!j.is_array()) fail("expected a list");
  }
  std::string str() const {
    if (!j.is_string()) fail("expected a string");
    return j.get<std::string>();
  }
  bool boolean() const {
    if (!j.is_boolean()) fail("expected true or false");
    return j.get<bool>();
  }
  int64_t integer() const {
    if (!j.is_number_integer()) fail("expected an integer");
    return j.get<int64_t>();
  }
  std::string str_or(std::string_view key, std::string def) const {
    return has_value(key) ? (*this)[key].str() : def;
  }
  bool bool_or(std::string_view key, bool def) const {
    return has_value(key) ? (*this)[key].boolean() : def;
  }
  int64_t int_or(std::string_view key, int64_t def) const {
    return has_value(key) ? (*this)[key].integer() : def;
  }
  [[noreturn]] void fail(std::string_view what) const {
    ZD_THROW_INPUT("{}: {}: {}, found {}", file, path.empty() ? "/" : path, what, j.type_name());
  }
};

}  // namespace zerod::tokenizer
