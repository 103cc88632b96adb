#include "tools/shards/byte_source.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace zerod::shards {

namespace {

// An uncompressed file.
class FileSource final : public ByteSource {
 public:
  explicit FileSource(const std::string& path) : path_(path) {
    file_ = std::fopen(path.c_str(), "rb");
    if (!file_) ZD_THROW_INPUT("cannot read input file '{}': {}", path, std::strerror(errno));
  }
  ~FileSource() override { std::fclose(file_); }
  FileSource(const FileSource&) = delete;
  FileSource& operator=(const FileSource&) = delete;

  size_t read(char* buf, size_t n) override {
    const size_t got = std::fread(buf, 1, n, file_);
    if (got < n && std::ferror(file_))
      ZD_THROW_INPUT("error while reading input file '{}': {}", path_, std::strerror(errno));
    return got;
  }
  const char* kind() const override { return "text"; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

std::string first_bytes(const std::string& path, size_t n) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) ZD_THROW_INPUT("cannot read input file '{}': {}", path, std::strerror(errno));
  std::string s(n, '\0');
  s.resize(std::fread(s.data(), 1, n, f));
  std::fclose(f);
  return s;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::unique_ptr<ByteSource> open_byte_source(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    ZD_THROW_INPUT("input '{}' is a directory, expected a text or JSONL file", path);
  const std::string head = first_bytes(path, 4);
  const bool gzip = head.size() >= 2 && static_cast<uint8_t>(head[0]) == 0x1f &&
                    static_cast<uint8_t>(head[1]) == 0x8b;
  const bool zstd = head.size() == 4 && head == std::string("\x28\xb5\x2f\xfd", 4);
  if (gzip) return open_gzip_source(path);
  if (zstd) return open_zstd_source(path);
  if (ends_with(path, ".gz") || ends_with(path, ".zst")) {
    ZD_THROW_INPUT(
        "input '{}': named {} but does not start with the {} magic bytes ({}); "
        "a truncated or mislabelled file?",
        path, ends_with(path, ".gz") ? ".gz" : ".zst", ends_with(path, ".gz") ? "gzip" : "zstd",
        ends_with(path, ".gz") ? "1f 8b" : "28 b5 2f fd");
  }
  return std::make_unique<FileSource>(path);
}

std::string read_all(ByteSource& source) {
  std::string out;
  constexpr size_t kChunk = 1 << 20;
  for (;;) {
    const size_t at = out.size();
    out.resize(at + kChunk);
    const size_t got = source.read(out.data() + at, kChunk);
    out.resize(at + got);
    if (got == 0) return out;
  }
}

bool LineReader::next(std::string& line) {
  constexpr size_t kChunk = 1 << 20;
  line.clear();
  for (;;) {
    const size_t nl = buffer_.find('\n', pos_);
    if (nl != std::string::npos) {
      line.append(buffer_, pos_, nl - pos_);
      pos_ = nl + 1;
      return true;
    }
    line.append(buffer_, pos_, std::string::npos);
    buffer_.clear();
    pos_ = 0;
    if (eof_) return !line.empty();
    buffer_.resize(kChunk);
    const size_t got = source_->read(buffer_.data(), kChunk);
    buffer_.resize(got);
    bytes_ += static_cast<int64_t>(got);
    if (got == 0) eof_ = true;
  }
}

}  // namespace zerod::shards
