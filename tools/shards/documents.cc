#include "tools/shards/documents.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <utility>

#include "core/error.h"

namespace zerod::shards {

namespace {

void check_readable(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    ZD_THROW_INPUT("input '{}' is a directory, expected a text or JSONL file", path);
}

std::string read_whole(const std::string& path) {
  check_readable(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) ZD_THROW_INPUT("cannot read input file '{}': {}", path, std::strerror(errno));
  std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) ZD_THROW_INPUT("error while reading input file '{}'", path);
  return text;
}

bool blank(const std::string& line) {
  return line.find_first_not_of(" \t\r\n") == std::string::npos;
}

}  // namespace

DocumentReader::DocumentReader(std::vector<std::string> files, DocumentOptions options)
    : files_(std::move(files)), options_(std::move(options)) {}

bool DocumentReader::open_next_file() {
  if (file_index_ >= files_.size()) return false;
  jsonl_path_ = files_[file_index_++];
  check_readable(jsonl_path_);
  jsonl_ = std::ifstream(jsonl_path_, std::ios::binary);
  if (!jsonl_) ZD_THROW_INPUT("cannot read input file '{}': {}", jsonl_path_, std::strerror(errno));
  line_ = 0;
  return true;
}

std::optional<std::string> DocumentReader::next() {
  if (!options_.jsonl) {
    if (file_index_ >= files_.size()) return std::nullopt;
    ++documents_;
    return read_whole(files_[file_index_++]);
  }
  std::string line;
  for (;;) {
    if (!jsonl_.is_open() || !std::getline(jsonl_, line)) {
      if (jsonl_.is_open() && jsonl_.bad())
        ZD_THROW_INPUT("error while reading input file '{}'", jsonl_path_);
      jsonl_.close();
      if (!open_next_file()) return std::nullopt;
      continue;
    }
    ++line_;
    if (blank(line)) continue;
    std::string problem;
    nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (record.is_discarded()) {
      problem = "not valid JSON";
    } else if (!record.is_object()) {
      problem = fmt::format("a JSON {}, expected an object", record.type_name());
    } else {
      const auto it = record.find(options_.text_key);
      if (it == record.end())
        problem = fmt::format("no \"{}\" member (--text-key)", options_.text_key);
      else if (!it->is_string())
        problem = fmt::format("\"{}\" is a JSON {}, expected a string", options_.text_key,
                              it->type_name());
      else {
        ++documents_;
        return it->get<std::string>();
      }
    }
    if (!options_.skip_bad_lines) {
      ZD_THROW_INPUT("{}:{}: {}; fix the line or pass --skip-bad-lines to skip such lines",
                     jsonl_path_, line_, problem);
    }
    ++bad_lines_;
    std::fprintf(stderr, "zerod-shards: skipped %s:%lld: %s\n", jsonl_path_.c_str(),
                 static_cast<long long>(line_), problem.c_str());
  }
}

}  // namespace zerod::shards
