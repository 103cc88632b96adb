#include "engine/data/shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "core/error.h"
#include "core/file_write.h"

namespace zerod {

// Tokens are used in place from the mapping; the format is little-endian.
static_assert(std::endian::native == std::endian::little, "zerod assumes a little-endian host");

namespace {

constexpr const char* kFormat =
    "an llm.c .bin token shard (256 int32 header, magic 20240520 for uint16 tokens or 20240801 "
    "for uint32 tokens)";

std::string errno_text(int err) {
  return std::strerror(err);
}

// Closes a file descriptor on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// A hint for a wrong magic: what the file probably is instead. Never the bytes themselves: the
// daemon may run jobs for someone who could not read the file (data.train: /etc/shadow), and the
// message goes back to them.
std::string magic_hint(const unsigned char* first, int32_t magic) {
  bool text = true;
  for (int i = 0; i < 4; ++i) {
    const unsigned char c = first[i];
    if (!(std::isprint(c) || c == '\n' || c == '\r' || c == '\t')) text = false;
  }
  if (text) return "; the file starts with text: turn text files into shards with zerod-shards";
  if (static_cast<int32_t>(__builtin_bswap32(static_cast<uint32_t>(magic))) == kShardMagic)
    return "; that is the magic byte-swapped: the file was written big-endian, expected "
           "little-endian";
  if (static_cast<int32_t>(__builtin_bswap32(static_cast<uint32_t>(magic))) == kShardMagicU32)
    return "; that is the uint32 magic byte-swapped: the file was written big-endian, expected "
           "little-endian";
  return "";
}

// Reads exactly `n` bytes at `offset` (fewer only at end of file); returns the count read.
size_t pread_full(int fd, void* buf, size_t n, off_t offset, const std::string& path) {
  size_t done = 0;
  while (done < n) {
    const ssize_t r =
        ::pread(fd, static_cast<char*>(buf) + done, n - done, offset + static_cast<off_t>(done));
    if (r < 0) {
      if (errno == EINTR) continue;
      ZD_THROW_INPUT("shard '{}': cannot read: {}", path, errno_text(errno));
    }
    if (r == 0) break;
    done += static_cast<size_t>(r);
  }
  return done;
}

// The largest of tokens[0, n): a branch-free reduction the compiler vectorises.
template <typename T>
uint32_t max_of(const T* tokens, int64_t n) {
  T m = 0;
  for (int64_t i = 0; i < n; ++i) m = tokens[i] > m ? tokens[i] : m;
  return m;
}

template <typename T>
int64_t first_at_least(const T* tokens, int64_t n, int64_t limit) {
  for (int64_t i = 0; i < n; ++i)
    if (static_cast<int64_t>(tokens[i]) >= limit) return i;
  return -1;
}

void write_full(int fd, const void* buf, size_t n, const std::string& path) {
  size_t done = 0;
  while (done < n) {
    const ssize_t w = ::write(fd, static_cast<const char*>(buf) + done, n - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      ZD_THROW_INPUT("cannot write shard '{}': {}", path, errno_text(errno));
    }
    done += static_cast<size_t>(w);
  }
}

}  // namespace

TokenShard::TokenShard(std::string path) : path_(std::move(path)) {
  Fd file{::open(path_.c_str(), O_RDONLY | O_CLOEXEC)};
  if (file.fd < 0)
    ZD_THROW_INPUT("cannot open shard '{}': {}; expected {}", path_, errno_text(errno), kFormat);
  struct stat st {};
  if (::fstat(file.fd, &st) != 0)
    ZD_THROW_INPUT("cannot stat shard '{}': {}", path_, errno_text(errno));
  if (!S_ISREG(st.st_mode))
    ZD_THROW_INPUT("shard '{}' is {}, expected a regular file: {}", path_,
                   S_ISDIR(st.st_mode) ? "a directory" : "not a regular file", kFormat);
  const int64_t size = static_cast<int64_t>(st.st_size);
  if (size == 0) ZD_THROW_INPUT("shard '{}' is empty (0 bytes), expected {}", path_, kFormat);

  std::array<int32_t, kShardHeaderInts> header{};
  const size_t got = pread_full(file.fd, header.data(), kShardHeaderBytes, 0, path_);
  if (got >= 4 && header[0] != kShardMagic && header[0] != kShardMagicU32) {
    // What was found is not quoted: the file's first bytes are its content.
    ZD_THROW_INPUT("shard '{}' has the wrong magic number: expected {} or {} ({}){}", path_,
                   kShardMagic, kShardMagicU32, kFormat,
                   magic_hint(reinterpret_cast<const unsigned char*>(header.data()), header[0]));
  }
  const bool wide = header[0] == kShardMagicU32;
  const int32_t want_version = wide ? kShardVersionU32 : kShardVersion;
  const char* width = wide ? "uint32" : "uint16";
  const int64_t tb = wide ? 4 : 2;
  if (size < kShardHeaderBytes) {
    ZD_THROW_INPUT("shard '{}' is truncated: found {} bytes, shorter than the {}-byte header of {}",
                   path_, size, kShardHeaderBytes, kFormat);
  }
  if (header[1] != want_version) {
    ZD_THROW_INPUT(
        "shard '{}' has an unsupported version: found {}, expected {} (magic {}, {} tokens){}",
        path_, header[1], want_version, header[0], width,
        header[1] == (wide ? kShardVersion : kShardVersionU32)
            ? fmt::format("; version {} belongs to magic {}: the header mixes the two formats",
                          header[1], wide ? kShardMagic : kShardMagicU32)
            : std::string());
  }
  const int64_t ntok = header[2];
  if (ntok == 0) {
    ZD_THROW_INPUT("shard '{}' holds no tokens (header token count 0), expected at least 1 token",
                   path_);
  }
  if (ntok < 0) {
    ZD_THROW_INPUT("shard '{}' has a negative token count in its header: found {}, expected >= 1",
                   path_, ntok);
  }
  const int64_t expected = kShardHeaderBytes + tb * ntok;
  if (size < expected) {
    ZD_THROW_INPUT(
        "shard '{}' is truncated: its header says {} tokens, so expected {} bytes ({} header + {} "
        "bytes per {} token), found {} bytes ({} bytes missing)",
        path_, ntok, expected, kShardHeaderBytes, tb, width, size, expected - size);
  }
  if (size > expected) {
    ZD_THROW_INPUT(
        "shard '{}' has {} trailing bytes: its header says {} tokens, so expected {} bytes ({} "
        "header + {} bytes per {} token), found {} bytes",
        path_, size - expected, ntok, expected, kShardHeaderBytes, tb, width, size);
  }

  void* map = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_PRIVATE, file.fd, 0);
  if (map == MAP_FAILED) ZD_THROW_INPUT("cannot map shard '{}': {}", path_, errno_text(errno));
  map_ = map;
  map_bytes_ = static_cast<size_t>(size);
  num_tokens_ = ntok;
  data_ = static_cast<const char*>(map) + kShardHeaderBytes;
  token_bytes_ = static_cast<int>(tb);
  max_token_ = wide ? max_of(static_cast<const uint32_t*>(data_), num_tokens_)
                    : max_of(static_cast<const uint16_t*>(data_), num_tokens_);
}

const uint16_t* TokenShard::tokens() const {
  ZD_CHECK(token_bytes_ == 2, "shard '{}' holds uint32 tokens; tokens() is for uint16 shards",
           path_);
  return static_cast<const uint16_t*>(data_);
}

const uint32_t* TokenShard::tokens32() const {
  ZD_CHECK(token_bytes_ == 4, "shard '{}' holds uint16 tokens; tokens32() is for uint32 shards",
           path_);
  return static_cast<const uint32_t*>(data_);
}

int64_t TokenShard::first_token_at_least(int64_t limit) const {
  return token_bytes_ == 2
             ? first_at_least(static_cast<const uint16_t*>(data_), num_tokens_, limit)
             : first_at_least(static_cast<const uint32_t*>(data_), num_tokens_, limit);
}

TokenShard::~TokenShard() {
  unmap();
}

void TokenShard::unmap() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  data_ = nullptr;
  token_bytes_ = 2;
  num_tokens_ = 0;
  max_token_ = 0;
}

TokenShard::TokenShard(TokenShard&& other) noexcept
    : path_(std::move(other.path_)),
      num_tokens_(std::exchange(other.num_tokens_, 0)),
      map_(std::exchange(other.map_, nullptr)),
      map_bytes_(std::exchange(other.map_bytes_, 0)),
      data_(std::exchange(other.data_, nullptr)),
      token_bytes_(std::exchange(other.token_bytes_, 2)),
      max_token_(std::exchange(other.max_token_, 0)) {}

TokenShard& TokenShard::operator=(TokenShard&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    num_tokens_ = std::exchange(other.num_tokens_, 0);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    data_ = std::exchange(other.data_, nullptr);
    token_bytes_ = std::exchange(other.token_bytes_, 2);
    max_token_ = std::exchange(other.max_token_, 0);
  }
  return *this;
}

namespace {

void write_shard_bytes(const std::string& path, int32_t magic, int32_t version, size_t count,
                       const void* data, size_t bytes) {
  ZD_CHECK(count > 0 && static_cast<int64_t>(count) <= kShardMaxTokens,
           "write_shard('{}'): {} tokens, expected 1..{}", path, count, kShardMaxTokens);
  std::array<int32_t, kShardHeaderInts> header{};
  header[0] = magic;
  header[1] = version;
  header[2] = static_cast<int32_t>(count);

  const std::string tmp = path + ".tmp";
  {
    Fd file{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
    if (file.fd < 0) ZD_THROW_INPUT("cannot create shard '{}': {}", tmp, errno_text(errno));
    try {
      write_full(file.fd, header.data(), kShardHeaderBytes, tmp);
      write_full(file.fd, data, bytes, tmp);
      if (::fsync(file.fd) != 0)
        ZD_THROW_INPUT("cannot fsync shard '{}': {}", tmp, errno_text(errno));
    } catch (...) {
      ::unlink(tmp.c_str());
      throw;
    }
  }
  rename_durably(tmp, path);
}

}  // namespace

void write_shard(const std::string& path, std::span<const uint16_t> tokens) {
  write_shard_bytes(path, kShardMagic, kShardVersion, tokens.size(), tokens.data(),
                    tokens.size_bytes());
}

void write_shard(const std::string& path, std::span<const uint32_t> tokens) {
  write_shard_bytes(path, kShardMagicU32, kShardVersionU32, tokens.size(), tokens.data(),
                    tokens.size_bytes());
}

}  // namespace zerod
