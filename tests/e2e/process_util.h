// Running zerod processes from tests: spawn with output to a file, wait with a deadline, kill.
// Every process a test starts is killed and reaped by its Process destructor.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <regex>

#include "engine/data/corpus.h"
#include "tests/loopback_ports.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace zerod::testing {

inline std::string zerod_binary() {
  return std::string(ZEROD_BINARY_DIR) + "/engine/zerod";
}

inline std::string zeroctl_binary() {
  return std::string(ZEROD_BINARY_DIR) + "/tools/zeroctl/zeroctl";
}

class Process {
 public:
  // Runs `args` (args[0] is the program) in `cwd` with stdout+stderr to `log`. With `own_group`
  // it leads a process group of its own, and killing it kills the whole group: for launchers
  // (torchrun) whose workers would outlive them.
  Process(const std::vector<std::string>& args, const std::string& cwd, const std::string& log,
          bool own_group = false)
      : log_(log), group_(own_group) {
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    if (own_group) {
      posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
      posix_spawnattr_setpgroup(&attr, 0);
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    posix_spawn_file_actions_addchdir_np(&fa, cwd.c_str());
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, argv[0], &fa, &attr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
  }
  ~Process() {
    if (pid_ > 0 && group_) ::kill(-pid_, SIGKILL);  // the group's other members too
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
  }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  bool started() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  // Exit code, -signal when killed by a signal, or nullopt-like -1000 on timeout.
  int wait_for(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!exited_) {
      int status = 0;
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        exited_ = true;
        code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) return kTimedOut;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return code_;
  }
  void kill9() { ::kill(group_ ? -pid_ : pid_, SIGKILL); }
  // Sends `sig` and waits up to `grace` for the exit, then SIGKILL; returns the exit code.
  int stop(int sig, std::chrono::milliseconds grace) {
    if (pid_ <= 0) return kTimedOut;
    if (!exited_) ::kill(pid_, sig);
    const int code = wait_for(grace);
    if (code != kTimedOut) return code;
    kill9();
    return wait_for(std::chrono::seconds(10));
  }
  std::string output() const {
    std::ifstream in(log_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // Waits until the output contains `text` (true) or the deadline passes / the process exits.
  bool wait_output(const std::string& text, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (output().find(text) != std::string::npos) return true;
      int status = 0;
      if (!exited_ && ::waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
      }
      if (exited_) return output().find(text) != std::string::npos;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  static constexpr int kTimedOut = -1000;

 private:
  pid_t pid_ = -1;
  std::string log_;
  bool group_ = false;
  bool exited_ = false;
  int code_ = 0;
};

// A TCP port on 127.0.0.1 that was free a moment ago, below the ephemeral range
// (tests/loopback_ports.h says why).
inline int free_port() {
  return zerod::testing_ports::pick_loopback_port();
}

// A fresh directory for one test (named after it and this process) with byte-level token
// shards data/c_train_*.bin and data/c_val_*.bin of `sentence` repeated.
// Starts `binary args...` in `dir` with stdout+stderr to dir/log and, when given, `env`
// ("NAME=VALUE") added to its environment.
inline std::unique_ptr<Process> start_in(const std::filesystem::path& dir,
                                         const std::vector<std::string>& args,
                                         const std::string& log, const std::string& env = "",
                                         const std::string& binary = zerod_binary()) {
  std::vector<std::string> argv;
  if (!env.empty()) argv = {"/usr/bin/env", env};
  argv.push_back(binary);
  argv.insert(argv.end(), args.begin(), args.end());
  auto p = std::make_unique<Process>(argv, dir.string(), (dir / log).string());
  EXPECT_TRUE(p->started());
  return p;
}

// The loss zerod printed for step `step` (steps_per_print 1), or -1.
inline double printed_loss(const std::string& out, int step) {
  const std::regex re("step +" + std::to_string(step) + "/[0-9]+ \\| loss ([0-9.]+)");
  std::smatch m;
  return std::regex_search(out, m, re) ? std::stod(m[1]) : -1;
}

inline std::filesystem::path make_test_dir(const std::string& prefix, const std::string& sentence) {
  const auto dir = std::filesystem::temp_directory_path() /
                   (prefix + "_" + std::to_string(::getpid()) + "_" +
                    ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::string text;
  while (text.size() < 40000) text += sentence;
  write_text_shards({reinterpret_cast<const uint8_t*>(text.data()), text.size()},
                    (dir / "data").string(), 0.1, 1 << 20, "c");
  return dir;
}

// GET http://127.0.0.1:port/metrics with a plain socket (and `headers`, each ending "\r\n");
// the whole response ("" on failure).
inline std::string scrape(int port, const std::string& headers = "") {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    const std::string req = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n" + headers + "\r\n";
    (void)!::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

// The value of `series` (name and labels as Prometheus prints them) in a scrape, or -1.
inline double metric(const std::string& text, const std::string& series) {
  const auto at = text.find("\n" + series + " ");
  return at == std::string::npos ? -1 : std::stod(text.substr(at + series.size() + 2));
}

}  // namespace zerod::testing
