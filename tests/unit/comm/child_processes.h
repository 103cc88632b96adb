// Helper processes of the multi-process comm tests: this test binary started again
// (posix_spawn) to run one disabled helper test, configured through environment variables, with
// a FileStore over a fresh temporary directory for the processes to meet in and report through.
// The destructor kills (SIGKILL) and reaps every child still running and removes the directory,
// so a failing test leaves nothing behind.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/file_store.h"
#include "tests/unit/comm/comm_test_util.h"

extern char** environ;

namespace zerod::test {

class ChildProcesses {
 public:
  ChildProcesses() {
    char tmpl[] = "/tmp/zerod-comm-test-XXXXXX";
    EXPECT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    store_ = std::make_shared<FileStore>(dir_);
  }
  ~ChildProcesses() {
    for (pid_t p : pids_) {
      if (p > 0) {
        ::kill(p, SIGKILL);
        ::waitpid(p, nullptr, 0);
      }
    }
    std::filesystem::remove_all(dir_);
  }
  ChildProcesses(const ChildProcesses&) = delete;
  ChildProcesses& operator=(const ChildProcesses&) = delete;

  const std::string& dir() const { return dir_; }
  FileStore& store() { return *store_; }

  // Starts this binary running only `test` ("Suite.DISABLED_Name"), with this process's
  // environment plus `env` ("NAME=value"); its output goes to <dir>/.log-<log_name>.
  pid_t spawn(const std::string& test, const std::vector<std::string>& env,
              const std::string& log_name) {
    std::vector<std::string> envs;
    for (char** e = environ; *e != nullptr; ++e) envs.emplace_back(*e);
    envs.insert(envs.end(), env.begin(), env.end());
    std::vector<std::string> args = {"/proc/self/exe", "--gtest_filter=" + test,
                                     "--gtest_also_run_disabled_tests"};
    std::vector<char*> cenv, cargs;
    for (auto& s : envs) cenv.push_back(s.data());
    cenv.push_back(nullptr);
    for (auto& s : args) cargs.push_back(s.data());
    cargs.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    const std::string log = dir_ + "/.log-" + log_name;
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    pid_t pid = -1;
    const int rc =
        ::posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, cargs.data(), cenv.data());
    posix_spawn_file_actions_destroy(&actions);
    EXPECT_EQ(rc, 0) << std::strerror(rc);
    pids_.push_back(pid);
    return pid;
  }

  // Waits for `pid` up to `limit`; returns its wait status, or -1 if it is still running.
  int wait(pid_t pid, Ms limit) {
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        for (auto& p : pids_) {
          if (p == pid) p = -1;
        }
        return status;
      }
      if (ms_since(t0) > limit.count()) return -1;
      std::this_thread::sleep_for(Ms(5));
    }
  }

  // The text a child stored under `key` (waiting up to a second for it).
  std::string text(const std::string& key) {
    const Bytes b = store_->get(key, Ms(1000));
    return std::string(b.begin(), b.end());
  }

 private:
  std::string dir_;
  std::shared_ptr<FileStore> store_;
  std::vector<pid_t> pids_;
};

}  // namespace zerod::test
