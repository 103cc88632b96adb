// gzip inputs through zlib (concatenated members read as one stream, as zcat does).
#include "tools/shards/byte_source.h"

#include <cerrno>
#include <climits>
#include <cstring>

#include "core/error.h"

#ifdef ZEROD_HAVE_ZLIB
#include <zlib.h>
#endif

namespace zerod::shards {

#ifdef ZEROD_HAVE_ZLIB

namespace {

class GzipSource final : public ByteSource {
 public:
  explicit GzipSource(const std::string& path) : path_(path) {
    file_ = gzopen(path.c_str(), "rb");
    if (!file_) ZD_THROW_INPUT("cannot read input file '{}': {}", path, std::strerror(errno));
    gzbuffer(file_, 1 << 18);
  }
  ~GzipSource() override { gzclose(file_); }
  GzipSource(const GzipSource&) = delete;
  GzipSource& operator=(const GzipSource&) = delete;

  size_t read(char* buf, size_t n) override {
    if (n > static_cast<size_t>(INT_MAX)) n = INT_MAX;
    const int got = gzread(file_, buf, static_cast<unsigned>(n));
    if (got < 0) {
      int code = 0;
      const char* what = gzerror(file_, &code);
      ZD_THROW_INPUT("input '{}': corrupt gzip data (zlib: {})", path_,
                     what && *what ? what : "unknown error");
    }
    if (got == 0) {
      // zlib reports a stream cut short as Z_BUF_ERROR at the end instead of a negative count.
      int code = 0;
      const char* what = gzerror(file_, &code);
      if (code != Z_OK) {
        ZD_THROW_INPUT("input '{}': corrupt or truncated gzip data (zlib: {})", path_,
                       what && *what ? what : "unknown error");
      }
    }
    return static_cast<size_t>(got);
  }
  const char* kind() const override { return "gzip"; }

 private:
  std::string path_;
  gzFile file_ = nullptr;
};

}  // namespace

std::unique_ptr<ByteSource> open_gzip_source(const std::string& path) {
  return std::make_unique<GzipSource>(path);
}

#else

std::unique_ptr<ByteSource> open_gzip_source(const std::string& path) {
  ZD_THROW_INPUT(
      "input '{}' is gzip data, and this zerod-shards was built without zlib "
      "(install zlib1g-dev and rebuild, or decompress it first)",
      path);
}

#endif

}  // namespace zerod::shards
