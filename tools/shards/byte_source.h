// The bytes of an input file, decompressed when it is gzip or zstd: zerod-shards reads text and
// JSONL files as they are or compressed (`.gz` through zlib, `.zst` through libzstd).
//
// The kind is told by the file's first bytes (gzip 1f 8b, zstd 28 b5 2f fd), not its name, so a
// renamed file still reads; a file named .gz or .zst that does not start so is an InputError.
// Corrupt or truncated compressed data is an InputError naming the file and what the library
// said; concatenated gzip members and zstd frames read as one stream (as `zcat`, `zstdcat`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace zerod::shards {

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Reads up to n bytes into buf; returns how many, 0 only at the end of the data.
  virtual size_t read(char* buf, size_t n) = 0;
  // "text", "gzip" or "zstd".
  virtual const char* kind() const = 0;
};

// Opens path (InputError when it is missing, a directory or unreadable, or a compressed kind
// this build lacks: the message names the library).
std::unique_ptr<ByteSource> open_byte_source(const std::string& path);

// What is left of source, decompressed.
std::string read_all(ByteSource& source);

// Lines of a ByteSource, split at '\n' (the '\n' not included; a last line without one still
// counts).
class LineReader {
 public:
  explicit LineReader(std::unique_ptr<ByteSource> source) : source_(std::move(source)) {}
  // The next line into `line`; false after the last one.
  bool next(std::string& line);
  // The decompressed bytes read so far.
  int64_t bytes() const { return bytes_; }

 private:
  std::unique_ptr<ByteSource> source_;
  std::string buffer_;
  size_t pos_ = 0;
  bool eof_ = false;
  int64_t bytes_ = 0;
};

// The per-kind sources behind open_byte_source (gzip_source.cc, zstd_source.cc). They throw the
// InputError naming the missing library when this build has none.
std::unique_ptr<ByteSource> open_gzip_source(const std::string& path);
std::unique_ptr<ByteSource> open_zstd_source(const std::string& path);

}  // namespace zerod::shards
