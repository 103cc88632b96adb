#include "engine/control/journal.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "engine/config/input_limits.h"
#include "engine/runtime/grpc/endpoint.h"

namespace zerod {

namespace {

constexpr int kFormat = 1;

void write_all(int fd, const std::string& text, const std::string& path) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t w = ::write(fd, text.data() + done, text.size() - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      ZD_THROW_INPUT("cannot write the daemon's journal {}: {}", path, std::strerror(errno));
    }
    done += static_cast<size_t>(w);
  }
}

// The journal is not one zerod wrote (its content is never quoted: the file could be anything).
[[noreturn]] void bad_journal(const std::string& path, const char* why) {
  ZD_THROW_INPUT(
      "the daemon's journal {} is not a journal zerod wrote ({}); move it aside to start with no "
      "job (job ids then start again at job-1)",
      path, why);
}

}  // namespace

StateDir::StateDir(std::string dir) : dir_(std::move(dir)) {
  ensure_private_dir(dir_, "--state-dir");
  const std::string lock = dir_ + "/lock";
  lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd_ < 0)
    ZD_THROW_INPUT("--state-dir {}: cannot open {}: {}", dir_, lock, std::strerror(errno));
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    std::string holder;
    char buf[32] = {};
    if (::pread(lock_fd_, buf, sizeof(buf) - 1, 0) > 0) {
      for (const char* c = buf; *c >= '0' && *c <= '9'; ++c) holder += *c;  // a pid, nothing else
    }
    ::close(lock_fd_);
    lock_fd_ = -1;
    ZD_THROW_INPUT(
        "--state-dir {}: another zerod serve{} uses this state directory; give each daemon its "
        "own --state-dir",
        dir_, holder.empty() ? "" : " (pid " + holder + ")");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(lock_fd_, 0) == 0) write_all(lock_fd_, pid, lock);
}

StateDir::~StateDir() {
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

std::optional<Journal> StateDir::read() const {
  const std::string path = journal_path();
  if (::access(path.c_str(), F_OK) != 0 && errno == ENOENT) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  if (!in) ZD_THROW_INPUT("the daemon's journal {}: cannot read it", path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  if (!config::json_depth_problem(text).empty()) bad_journal(path, "nested too deep");
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) bad_journal(path, "not JSON");
  try {
    if (j.at("format").get<int>() != kFormat) bad_journal(path, "another format version");
    Journal out;
    out.jobs_started = j.at("jobs_started").get<int64_t>();
    if (out.jobs_started < 0) bad_journal(path, "a negative job count");
    if (j.contains("job") && !j["job"].is_null()) {
      const nlohmann::json& o = j["job"];
      JournalJob job;
      job.id = o.at("id").get<std::string>();
      job.state = o.at("state").get<std::string>();
      job.reason = o.value("reason", "");
      job.stopped = o.value("stopped", false);
      job.name = o.value("name", "");
      job.text = o.at("text").get<std::string>();
      job.resume = o.value("resume", "");
      job.checkpoint_dir = o.value("checkpoint_dir", "");
      job.cwd = o.value("cwd", "");
      job.base_dir = o.value("base_dir", "");
      out.job = std::move(job);
    }
    return out;
  } catch (const nlohmann::json::exception&) {
    bad_journal(path, "a key is missing or has the wrong type");
  }
}

void StateDir::write(const Journal& journal) const {
  nlohmann::json j;
  j["format"] = kFormat;
  j["jobs_started"] = journal.jobs_started;
  if (journal.job) {
    const JournalJob& o = *journal.job;
    j["job"] = {{"id", o.id},
                {"state", o.state},
                {"reason", o.reason},
                {"stopped", o.stopped},
                {"name", o.name},
                {"resume", o.resume},
                {"checkpoint_dir", o.checkpoint_dir},
                {"cwd", o.cwd},
                {"base_dir", o.base_dir},
                {"text", o.text}};
  } else {
    j["job"] = nullptr;
  }
  // Invalid UTF-8 in a submitted text is replaced rather than refused.
  const std::string text = j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  const std::string path = journal_path(), tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    ZD_THROW_INPUT("cannot write the daemon's journal {}: {}", tmp, std::strerror(errno));
  }
  try {
    write_all(fd, text, tmp);
    if (::fsync(fd) != 0) {
      ZD_THROW_INPUT("cannot fsync the daemon's journal {}: {}", tmp, std::strerror(errno));
    }
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    ZD_THROW_INPUT("cannot replace the daemon's journal {}: {}", path, std::strerror(err));
  }
  const int dfd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace zerod
