// zstd inputs through libzstd's streaming decompressor (concatenated frames read as one
// stream, as zstdcat does).
#include "tools/shards/byte_source.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/error.h"

#ifdef ZEROD_HAVE_ZSTD
#include <zstd.h>
#endif

namespace zerod::shards {

#ifdef ZEROD_HAVE_ZSTD

namespace {

class ZstdSource final : public ByteSource {
 public:
  explicit ZstdSource(const std::string& path) : path_(path) {
    file_ = std::fopen(path.c_str(), "rb");
    if (!file_) ZD_THROW_INPUT("cannot read input file '{}': {}", path, std::strerror(errno));
    ctx_ = ZSTD_createDStream();
    if (!ctx_) {
      std::fclose(file_);
      ZD_THROW("input '{}': cannot create a zstd decompression context", path);
    }
    in_buf_.resize(ZSTD_DStreamInSize());
  }
  ~ZstdSource() override {
    ZSTD_freeDStream(ctx_);
    std::fclose(file_);
  }
  ZstdSource(const ZstdSource&) = delete;
  ZstdSource& operator=(const ZstdSource&) = delete;

  size_t read(char* buf, size_t n) override {
    ZSTD_outBuffer out{buf, n, 0};
    while (out.pos == 0) {
      // Decompress what is buffered; with no input left, still once more while inside a frame,
      // to flush output the last call had no room for.
      if (in_.pos < in_.size || in_frame_) {
        const size_t ret = ZSTD_decompressStream(ctx_, &out, &in_);
        if (ZSTD_isError(ret))
          ZD_THROW_INPUT("input '{}': corrupt zstd data (zstd: {})", path_, ZSTD_getErrorName(ret));
        in_frame_ = ret != 0;  // 0: a frame just ended and everything is flushed
        if (out.pos > 0 || in_.pos < in_.size) continue;
      }
      const size_t got = std::fread(in_buf_.data(), 1, in_buf_.size(), file_);
      if (got < in_buf_.size() && std::ferror(file_))
        ZD_THROW_INPUT("error while reading input file '{}': {}", path_, std::strerror(errno));
      if (got == 0) {
        if (in_frame_)
          ZD_THROW_INPUT("input '{}': truncated zstd data (the file ends inside a frame)", path_);
        return 0;
      }
      in_ = ZSTD_inBuffer{in_buf_.data(), got, 0};
    }
    return out.pos;
  }
  const char* kind() const override { return "zstd"; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  ZSTD_DStream* ctx_ = nullptr;
  std::vector<char> in_buf_;
  ZSTD_inBuffer in_{nullptr, 0, 0};
  bool in_frame_ = false;
};

}  // namespace

std::unique_ptr<ByteSource> open_zstd_source(const std::string& path) {
  return std::make_unique<ZstdSource>(path);
}

#else

std::unique_ptr<ByteSource> open_zstd_source(const std::string& path) {
  ZD_THROW_INPUT(
      "input '{}' is zstd data, and this zerod-shards was built without libzstd "
      "(install libzstd-dev and rebuild, or decompress it first)",
      path);
}

#endif

}  // namespace zerod::shards
