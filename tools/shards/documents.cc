#include "tools/shards/documents.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include "core/error.h"

namespace zerod::shards {

namespace {

bool blank(const std::string& line) {
  return line.find_first_not_of(" \t\r\n") == std::string::npos;
}

}  // namespace

DocumentReader::DocumentReader(std::vector<std::string> files, DocumentOptions options)
    : files_(std::move(files)), options_(std::move(options)) {}

bool DocumentReader::open_next_file() {
  if (file_index_ >= files_.size()) return false;
  jsonl_path_ = files_[file_index_++];
  std::unique_ptr<ByteSource> source = open_byte_source(jsonl_path_);
  inputs_.push_back(InputStats{jsonl_path_, source->kind()});
  jsonl_ = std::make_unique<LineReader>(std::move(source));
  line_ = 0;
  return true;
}

std::optional<std::string> DocumentReader::next() {
  if (!options_.jsonl) {
    if (file_index_ >= files_.size()) return std::nullopt;
    const std::string& path = files_[file_index_++];
    std::unique_ptr<ByteSource> source = open_byte_source(path);
    InputStats stats{path, source->kind()};
    std::string text = read_all(*source);
    stats.bytes = static_cast<int64_t>(text.size());
    stats.documents = 1;
    inputs_.push_back(std::move(stats));
    ++documents_;
    return text;
  }
  std::string line;
  for (;;) {
    if (!jsonl_ || !jsonl_->next(line)) {
      jsonl_.reset();
      if (!open_next_file()) return std::nullopt;
      continue;
    }
    inputs_.back().bytes = jsonl_->bytes();
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
        ++inputs_.back().documents;
        return it->get<std::string>();
      }
    }
    if (!options_.skip_bad_lines) {
      ZD_THROW_INPUT("{}:{}: {}; fix the line or pass --skip-bad-lines to skip such lines",
                     jsonl_path_, line_, problem);
    }
    ++bad_lines_;
    ++inputs_.back().bad_lines;
    std::fprintf(stderr, "zerod-shards: skipped %s:%lld: %s\n", jsonl_path_.c_str(),
                 static_cast<long long>(line_), problem.c_str());
  }
}

}  // namespace zerod::shards
