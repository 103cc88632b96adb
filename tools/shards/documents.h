// The documents zerod-shards tokenizes: whole text files, or the records of JSONL files.
//
// A text file is one document (its bytes as they are). In a JSONL file every non-blank line is
// one JSON object whose `text_key` member (a string) is one document. A line that is not such
// an object is an InputError naming the file, the line number and what is wrong, unless
// skip_bad_lines: then it is counted in bad_lines() and reported once per line on stderr.
// Documents come out in input order. Files may be gzip or zstd compressed (byte_source.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tools/shards/byte_source.h"

namespace zerod::shards {

struct DocumentOptions {
  bool jsonl = false;
  std::string text_key = "text";
  bool skip_bad_lines = false;
};

// What was read from one input file.
struct InputStats {
  std::string path;
  std::string kind;   // "text", "gzip" or "zstd"
  int64_t bytes = 0;  // decompressed
  int64_t documents = 0;
  int64_t bad_lines = 0;
};

class DocumentReader {
 public:
  DocumentReader(std::vector<std::string> files, DocumentOptions options);

  // The next document, or nullopt after the last one.
  std::optional<std::string> next();

  int64_t documents() const { return documents_; }
  int64_t bad_lines() const { return bad_lines_; }
  // The files opened so far, in order.
  const std::vector<InputStats>& inputs() const { return inputs_; }

 private:
  bool open_next_file();

  std::vector<std::string> files_;
  DocumentOptions options_;
  size_t file_index_ = 0;  // the next file to open
  std::unique_ptr<LineReader> jsonl_;  // the JSONL file being read
  std::string jsonl_path_;
  std::vector<InputStats> inputs_;
  int64_t line_ = 0;
  int64_t documents_ = 0;
  int64_t bad_lines_ = 0;
};

}  // namespace zerod::shards
