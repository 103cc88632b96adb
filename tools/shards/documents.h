// The documents zerod-shards tokenizes: whole text files, or the records of JSONL files.
//
// A text file is one document (its bytes as they are). In a JSONL file every non-blank line is
// one JSON object whose `text_key` member (a string) is one document. A line that is not such
// an object is an InputError naming the file, the line number and what is wrong, unless
// skip_bad_lines: then it is counted in bad_lines() and reported once per line on stderr.
// Documents come out in input order.
#pragma once

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace zerod::shards {

struct DocumentOptions {
  bool jsonl = false;
  std::string text_key = "text";
  bool skip_bad_lines = false;
};

class DocumentReader {
 public:
  DocumentReader(std::vector<std::string> files, DocumentOptions options);

  // The next document, or nullopt after the last one.
  std::optional<std::string> next();

  int64_t documents() const { return documents_; }
  int64_t bad_lines() const { return bad_lines_; }

 private:
  bool open_next_file();

  std::vector<std::string> files_;
  DocumentOptions options_;
  size_t file_index_ = 0;  // the next file to open
  std::ifstream jsonl_;    // the JSONL file being read
  std::string jsonl_path_;
  int64_t line_ = 0;
  int64_t documents_ = 0;
  int64_t bad_lines_ = 0;
};

}  // namespace zerod::shards
