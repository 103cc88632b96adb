#include "engine/checkpoint/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "core/error.h"

namespace zerod {

namespace fs = std::filesystem;

namespace {
std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "?";
  return buf;
}

// What the holder wrote (its first line), bounded, printable characters only.
std::string holder_of(int fd) {
  char buf[512] = {};
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  std::string s;
  for (ssize_t i = 0; i < n && buf[i] != '\n'; ++i)
    s += (buf[i] >= 32 && buf[i] < 127) ? buf[i] : '?';
  return s.empty() ? "a job that has not written its name yet" : s;
}
}  // namespace

CheckpointDirLock::CheckpointDirLock(const std::string& dir, const std::string& key,
                                     const std::string& job) {
  std::error_code ec;
  dir_ = dir;
  created_ = !fs::exists(dir, ec);
  fs::create_directories(dir, ec);
  if (ec) ZD_THROW_INPUT("{}: cannot create {}: {}", key, dir, ec.message());
  path_ = (fs::path(dir) / ".zerod.lock").string();
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    ZD_THROW_INPUT("{}: cannot open the lock file {}: {}", key, path_, std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string holder = err == EWOULDBLOCK ? holder_of(fd_) : "";
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK) {
      ZD_THROW_INPUT(
          "{}: {} is in use by another zerod job ({}); two jobs writing one checkpoint directory "
          "would overwrite each other's checkpoints: give this job its own directory, or stop "
          "the other one first",
          key, dir, holder);
    }
    ZD_THROW_INPUT("{}: cannot lock {}: {}", key, path_, std::strerror(err));
  }
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char when[32];
  std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
  const std::string line =
      fmt::format("host {}, pid {}, job {}, since {}\n", host_name(), ::getpid(), job, when);
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, line.data(), line.size(), 0) < 0) {
    // The lock holds without the description; nothing to fail for.
  }
}

CheckpointDirLock::~CheckpointDirLock() {
  if (fd_ < 0) return;
  if (created_) {
    // Made by this job and still empty but for the lock: remove both (while still holding it).
    std::error_code ec;
    bool only_lock = true;
    for (const auto& e : fs::directory_iterator(dir_, ec)) only_lock &= e.path() == fs::path(path_);
    if (!ec && only_lock) {
      ::unlink(path_.c_str());
      ::rmdir(dir_.c_str());
    }
  }
  ::close(fd_);  // releases the lock (the file stays for the next holder)
}

}  // namespace zerod
