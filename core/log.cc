#include "core/log.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <string>

#include "core/error.h"

namespace zerod::log {

namespace {
thread_local int t_rank = -1;

// %R: "[rank N] " for threads with a rank, nothing otherwise.
class RankFlag : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg&, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    if (t_rank < 0) return;
    fmt::format_to(std::back_inserter(dest), "[rank {}] ", t_rank);
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<RankFlag>();
  }
};

// The progress line: its text and the descriptor it is drawn on, under one mutex that every
// log line also takes (through ProgressAwareSink), so a line and the display never interleave.
struct Progress {
  std::mutex mu;
  int fd = STDERR_FILENO;
  int enabled = -1;  // -1: not decided yet (the terminal check on first use)
  std::string text;  // shown now; empty: nothing shown
};

Progress& progress() {
  static Progress p;
  return p;
}

bool enabled_locked(Progress& p) {
  if (p.enabled < 0) {
    const char* env = std::getenv("ZEROD_PROGRESS");
    const char* term = std::getenv("TERM");
    p.enabled = ::isatty(p.fd) == 1 && !(env != nullptr && std::string(env) == "0") &&
                !(term != nullptr && std::string(term) == "dumb");
  }
  return p.enabled == 1;
}

void write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t w = ::write(fd, s.data() + done, s.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;  // a terminal gone away: nothing to do about it
    done += static_cast<size_t>(w);
  }
}

constexpr const char* kClear = "\r\033[K";  // to the line's start, erase to its end

// Wraps the console sink: a log line first erases the progress line, then the progress line is
// drawn again after it.
class ProgressAwareSink : public spdlog::sinks::sink {
 public:
  explicit ProgressAwareSink(std::shared_ptr<spdlog::sinks::sink> inner)
      : inner_(std::move(inner)) {}
  void log(const spdlog::details::log_msg& msg) override {
    Progress& p = progress();
    std::lock_guard lock(p.mu);
    const bool shown = !p.text.empty() && enabled_locked(p);
    if (shown) write_all(p.fd, kClear);
    inner_->log(msg);
    if (shown) {
      inner_->flush();
      write_all(p.fd, p.text);
    }
  }
  void flush() override { inner_->flush(); }
  void set_pattern(const std::string& pattern) override { inner_->set_pattern(pattern); }
  void set_formatter(std::unique_ptr<spdlog::formatter> f) override {
    inner_->set_formatter(std::move(f));
  }

 private:
  std::shared_ptr<spdlog::sinks::sink> inner_;
};
}  // namespace

bool progress_enabled() {
  Progress& p = progress();
  std::lock_guard lock(p.mu);
  return enabled_locked(p);
}

void set_progress(const std::string& text) {
  Progress& p = progress();
  std::lock_guard lock(p.mu);
  if (!enabled_locked(p)) return;
  p.text = text;
  write_all(p.fd, std::string(kClear) + text);
}

void clear_progress() {
  Progress& p = progress();
  std::lock_guard lock(p.mu);
  if (p.text.empty() || !enabled_locked(p)) return;
  p.text.clear();
  write_all(p.fd, kClear);
}

void set_progress_fd_for_test(int fd) {
  Progress& p = progress();
  std::lock_guard lock(p.mu);
  p.text.clear();
  p.fd = fd < 0 ? STDERR_FILENO : fd;
  p.enabled = -1;
}

void init() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto console = std::make_shared<spdlog::sinks::stdout_color_sink_mt>();
    auto logger = std::make_shared<spdlog::logger>(
        "zerod", std::make_shared<ProgressAwareSink>(std::move(console)));
    spdlog::register_logger(logger);
    auto formatter = std::make_unique<spdlog::pattern_formatter>();
    formatter->add_flag<RankFlag>('R').set_pattern("[%H:%M:%S.%e] %^%-5l%$ %R%v");
    logger->set_formatter(std::move(formatter));
    spdlog::set_default_logger(logger);
  });
}

void set_thread_rank(int rank) {
  t_rank = rank;
}
int thread_rank() {
  return t_rank;
}

void set_level(const std::string& name) {
  auto level = spdlog::level::from_str(name);
  if (level == spdlog::level::off && name != "off") {
    ZD_THROW_INPUT(
        "--log-level: unknown level '{}' (allowed: trace, debug, info, warn, error, off)", name);
  }
  spdlog::set_level(level);
}

}  // namespace zerod::log
