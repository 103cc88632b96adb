#include "comm/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <thread>

#include "core/error.h"

namespace zerod {

namespace {

// Closes a file descriptor on scope exit.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

bool write_all(int fd, const uint8_t* data, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Sleeps for the next poll interval (1 ms, doubling up to 20 ms) without passing the deadline.
void poll_sleep(Millis* interval, std::chrono::steady_clock::time_point deadline) {
  auto now = std::chrono::steady_clock::now();
  auto left = std::chrono::duration_cast<Millis>(deadline - now);
  std::this_thread::sleep_for(std::max(Millis(0), std::min(*interval, left)));
  *interval = std::min(Millis(20), *interval * 2);
}

}  // namespace

FileStore::FileStore(std::string dir) : dir_(std::move(dir)) {
  ZD_CHECK(!dir_.empty(), "FileStore needs a directory");
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  ZD_CHECK(!ec && std::filesystem::is_directory(dir_), "cannot create the store directory '{}': {}",
           dir_, ec.message());
}

std::string FileStore::file_name(const std::string& key) {
  ZD_CHECK(!key.empty(), "store keys must not be empty");
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  out.reserve(key.size());
  for (size_t i = 0; i < key.size(); ++i) {
    const auto c = static_cast<unsigned char>(key[i]);
    const bool plain = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                       c == '_' || c == '-' || (c == '.' && i > 0);
    if (plain) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

bool FileStore::read(const std::string& key, Bytes* out) const {
  Fd f(::open(path(key).c_str(), O_RDONLY | O_CLOEXEC));
  if (f.fd < 0) {
    ZD_CHECK(errno == ENOENT, "cannot open store file '{}': {}", path(key), std::strerror(errno));
    return false;
  }
  out->clear();
  uint8_t buf[4096];
  for (;;) {
    ssize_t r = ::read(f.fd, buf, sizeof(buf));
    if (r < 0 && errno == EINTR) continue;
    ZD_CHECK(r >= 0, "cannot read store file '{}': {}", path(key), std::strerror(errno));
    if (r == 0) break;
    out->insert(out->end(), buf, buf + r);
  }
  return true;
}

void FileStore::write_atomically(const std::string& key, const Bytes& value) {
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = fmt::format("{}/.tmp.{}.{}", dir_, ::getpid(), counter++);
  {
    Fd f(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    ZD_CHECK(f.fd >= 0, "cannot create '{}': {}", tmp, std::strerror(errno));
    if (!write_all(f.fd, value.data(), value.size())) {
      const int err = errno;
      ::unlink(tmp.c_str());
      ZD_THROW("cannot write '{}': {}", tmp, std::strerror(err));
    }
  }
  if (::rename(tmp.c_str(), path(key).c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    ZD_THROW("cannot rename '{}' to '{}': {}", tmp, path(key), std::strerror(err));
  }
}

void FileStore::set(const std::string& key, const Bytes& value) {
  write_atomically(key, value);
}

Bytes FileStore::get(const std::string& key, Millis timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Millis interval(1);
  Bytes out;
  for (;;) {
    if (read(key, &out)) return out;
    if (std::chrono::steady_clock::now() >= deadline) {
      ZD_THROW_KIND(ErrorKind::kPeerLost, "{} (FileStore {})",
                    store_missing_keys_message({key}, timeout), dir_);
    }
    poll_sleep(&interval, deadline);
  }
}

void FileStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Millis interval(1);
  for (;;) {
    std::vector<std::string> missing;
    for (const auto& k : keys) {
      if (::access(path(k).c_str(), F_OK) != 0) missing.push_back(k);
    }
    if (missing.empty()) return;
    if (std::chrono::steady_clock::now() >= deadline) {
      ZD_THROW_KIND(ErrorKind::kPeerLost, "{} (FileStore {})",
                    store_missing_keys_message(missing, timeout), dir_);
    }
    poll_sleep(&interval, deadline);
  }
}

bool FileStore::check(const std::vector<std::string>& keys) {
  for (const auto& k : keys) {
    if (::access(path(k).c_str(), F_OK) != 0) return false;
  }
  return true;
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  const std::string lock_path = dir_ + "/.lock";
  Fd lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  ZD_CHECK(lock.fd >= 0, "cannot open '{}': {}", lock_path, std::strerror(errno));
  while (::flock(lock.fd, LOCK_EX) != 0) {
    ZD_CHECK(errno == EINTR, "cannot lock '{}': {}", lock_path, std::strerror(errno));
  }
  // The lock is released when the descriptor closes (also on an exception).
  Bytes current;
  int64_t value = read(key, &current) ? store_parse_counter(key, current) : 0;
  value += delta;
  write_atomically(key, store_format_counter(value));
  return value;
}

}  // namespace zerod
