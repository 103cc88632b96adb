// Real processes: a node runs in a child process (this test binary, started in a helper mode)
// and is killed with SIGKILL; the node in this process must learn of it within a second.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cstdlib>

#include "core/timer.h"
#include "rdzv_test_util.h"

extern char** environ;

namespace zerod {
namespace {

using namespace zerod::test;

constexpr const char* kPortVar = "ZEROD_RDZV_TEST_PORT";
constexpr const char* kRankVar = "ZEROD_RDZV_TEST_RANK";

// The helper mode: one node of a 2-node world that beats until it is killed (at most 30 s).
// Disabled so that it runs only when a test below starts it in a child process.
TEST(RendezvousProcess, DISABLED_Node) {
  const char* port = std::getenv(kPortVar);
  const char* rank = std::getenv(kRankVar);
  if (port == nullptr || rank == nullptr) GTEST_SKIP() << "helper mode for the tests below";
  SessionOptions o = options();
  o.rendezvous_timeout = 10s;
  auto session = start_node_session(spec(2, std::atoi(rank), 1, std::atoi(port)), o);
  for (int i = 0; i < 600 && !session->world_failed(); ++i) std::this_thread::sleep_for(50ms);
}

// A child process running the helper mode; SIGKILLed and reaped when it goes out of scope.
class ChildNode {
 public:
  ChildNode(int port, int rank) {
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry = *e;
      if (entry.rfind("GTEST_", 0) == 0) continue;  // never write the parent's test report
      env.push_back(entry);
    }
    env.push_back(std::string(kPortVar) + "=" + std::to_string(port));
    env.push_back(std::string(kRankVar) + "=" + std::to_string(rank));
    std::vector<std::string> args = {"/proc/self/exe", "--gtest_also_run_disabled_tests",
                                     "--gtest_filter=RendezvousProcess.DISABLED_Node"};
    std::vector<char*> argv, envp;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    const int rc =
        posix_spawn(&pid_, "/proc/self/exe", &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    EXPECT_EQ(rc, 0) << "posix_spawn failed";
    if (rc != 0) pid_ = -1;
  }
  ~ChildNode() { kill_and_reap(); }

  // SIGKILL; returns the wait status.
  int kill_and_reap() {
    if (pid_ <= 0) return status_;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status_, 0);
    pid_ = -1;
    return status_;
  }
  bool running() const { return pid_ > 0; }

 private:
  pid_t pid_ = -1;
  int status_ = 0;
};

TEST(RendezvousProcess, AKilledNodeIsReportedDeadWithinASecond) {
  const int port = free_port();
  SessionOptions o = options();
  o.rendezvous_timeout = 10s;
  ChildNode child(port, /*rank=*/1);
  ASSERT_TRUE(child.running());
  auto session = start_node_session(spec(2, 0, 1, port), o);  // returns once the child joined
  std::this_thread::sleep_for(150ms);                         // a few beats
  ASSERT_FALSE(session->world_failed()) << session->failure_reason();

  const Stopwatch watch;
  const int status = child.kill_and_reap();
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  ASSERT_TRUE(eventually([&] { return session->world_failed(); }, 3s));
  EXPECT_LT(watch.seconds(), 1.0);
  const std::string reason = session->failure_reason();
  EXPECT_TRUE(contains(reason, "node 1 (rank 1")) << reason;
  EXPECT_FALSE(session->monitor()->snapshot()[1].alive);
  const Stopwatch leave_watch;
  session.reset();  // must not wait for the dead node
  EXPECT_LT(leave_watch.seconds(), 3.0);
}

TEST(RendezvousProcess, AKilledMasterIsNoticedWithinASecond) {
  const int port = free_port();
  SessionOptions o = options();
  o.rendezvous_timeout = 10s;
  ChildNode child(port, /*rank=*/0);  // the child hosts the rendezvous
  ASSERT_TRUE(child.running());
  auto session = start_node_session(spec(2, 1, 1, port), o);
  EXPECT_EQ(session->info().master_node_rank, 0);
  std::this_thread::sleep_for(150ms);
  ASSERT_FALSE(session->world_failed()) << session->failure_reason();

  const Stopwatch watch;
  child.kill_and_reap();
  ASSERT_TRUE(eventually([&] { return session->world_failed(); }, 3s));
  EXPECT_LT(watch.seconds(), 1.0);
  const std::string reason = session->failure_reason();
  EXPECT_TRUE(contains(reason, "lost the rendezvous master at 127.0.0.1:" + std::to_string(port)))
      << reason;
  EXPECT_EQ(session->monitor()->snapshot()[0].reason, "master unreachable");
  const Stopwatch leave_watch;
  session.reset();
  EXPECT_LT(leave_watch.seconds(), 3.0);
}

}  // namespace
}  // namespace zerod
