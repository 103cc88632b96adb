// Gloo communicators in two real processes bootstrapped through a FileStore: collectives and
// point-to-point messages work, and when one process is killed (kill -9) the other fails promptly
// (inside a collective, or waiting for a message) with an error naming the lost rank, and nothing
// is left running.
//
// The processes are this test binary started again (posix_spawn, child_processes.h) to run the
// disabled test GlooProcessHelper.DISABLED_Rank, configured by ZEROD_COMM_HELPER_* environment
// variables; it writes its outcome to the store under "result/<rank>".
#include <gtest/gtest.h>

#include <cstdlib>

#include "comm/file_store.h"
#include "tests/unit/comm/child_processes.h"
#include "tests/unit/comm/comm_test_util.h"

namespace zerod::test {
namespace {

using Clock = std::chrono::steady_clock;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// A few collectives with checked values; throws on a wrong value.
void run_checked_collectives(Communicator& c) {
  const int n = c.size();
  const int r = c.rank();
  for (size_t count : {size_t(1), size_t(1001), size_t(300000)}) {
    std::vector<float> v(count);
    for (size_t i = 0; i < count; ++i) v[i] = value<float>(r, i);
    c.all_reduce(v.data(), int64_t(count), CommType::kF32, ReduceOp::kSum);
    for (size_t i = 0; i < count; ++i) {
      ZD_CHECK(v[i] == expected<float>(n, i, ReduceOp::kSum), "all_reduce element {}", i);
    }
    std::vector<int64_t> send(count * n), recv(count);
    for (size_t i = 0; i < send.size(); ++i) send[i] = value<int64_t>(r, i);
    c.reduce_scatter(send.data(), recv.data(), int64_t(count), CommType::kI64, ReduceOp::kMax);
    for (size_t i = 0; i < count; ++i) {
      ZD_CHECK(recv[i] == expected<int64_t>(n, r * count + i, ReduceOp::kMax), "reduce_scatter {}",
               i);
    }
    std::vector<uint8_t> mine(count), all(count * n);
    for (size_t i = 0; i < count; ++i) mine[i] = value<uint8_t>(r, i);
    c.all_gather(mine.data(), all.data(), int64_t(count), CommType::kU8);
    for (size_t i = 0; i < all.size(); ++i) {
      ZD_CHECK(all[i] == value<uint8_t>(int(i / count), i % count), "all_gather element {}", i);
    }
  }
  c.barrier();
}

// `rounds` ping-pongs of 1 MB between the two ranks (rank 1 returns each message plus one), with
// checked values; throws on a wrong value.
void run_checked_ping_pong(Communicator& c, int rounds) {
  const int r = c.rank();
  std::vector<float> x(1 << 18);
  for (int k = 0; k < rounds; ++k) {
    if (r == 0) {
      for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(k + i % 1000);
      c.send(x.data(), int64_t(x.size()), CommType::kF32, 1, k);
      c.recv(x.data(), int64_t(x.size()), CommType::kF32, 1, k);
      for (size_t i = 0; i < x.size(); i += 97) {
        ZD_CHECK(x[i] == static_cast<float>(k + i % 1000 + 1), "ping-pong {} element {}", k, i);
      }
    } else {
      c.recv(x.data(), int64_t(x.size()), CommType::kF32, 0, k);
      for (float& v : x) v += 1.f;
      c.send(x.data(), int64_t(x.size()), CommType::kF32, 0, k);
    }
  }
}

// The helper process (see the file comment). Skipped unless started by the tests below.
TEST(GlooProcessHelper, DISABLED_Rank) {
  if (env("ZEROD_COMM_HELPER_RANK").empty()) GTEST_SKIP() << "only run by GlooProcesses tests";
  const int rank = std::stoi(env("ZEROD_COMM_HELPER_RANK"));
  const std::string mode = env("ZEROD_COMM_HELPER_MODE");
  auto store = std::make_shared<FileStore>(env("ZEROD_COMM_HELPER_DIR"));
  std::string result = "ok";
  try {
    GlooOptions o;
    o.rank = rank;
    o.size = 2;
    o.store = std::make_shared<PrefixStore>("comm", store);
    o.timeout = Ms(std::stoi(env("ZEROD_COMM_HELPER_TIMEOUT_MS")));
    if (mode == "shared") o.algorithm = GlooAlgorithm::kShared;  // (refused: another process)
    auto comm = make_gloo_communicator(o);
    if (mode == "collectives") {
      run_checked_collectives(*comm);
    } else if (mode == "p2p") {
      run_checked_ping_pong(*comm, 5);
    } else if (mode == "p2p_wait") {  // rank 0 ends up waiting for a message rank 1 never sends
      run_checked_ping_pong(*comm, 3);
      store->set("ready/" + std::to_string(rank), {});
      std::vector<float> x(1000);
      if (rank == 0) comm->recv(x.data(), 1000, CommType::kF32, 1, 7);
      if (rank == 1) std::this_thread::sleep_for(std::chrono::seconds(60));
    } else {  // "loop": all-reduce until something fails (or a minute passes)
      std::vector<float> v(4096, 1.0f);
      const auto t0 = Clock::now();
      for (int64_t k = 0; ms_since(t0) < 60000; ++k) {
        comm->all_reduce(v.data(), int64_t(v.size()), CommType::kF32, ReduceOp::kSum);
        if (k == 10) store->set("ready/" + std::to_string(rank), {});
      }
    }
  } catch (const Error& e) {
    result = fmt::format("error {} {}", e.exit_code(), e.what());
  }
  store->set("result/" + std::to_string(rank), Bytes(result.begin(), result.end()));
}

// The helper processes of the tests below.
class Helpers {
 public:
  FileStore& store() { return procs_.store(); }

  pid_t spawn(int rank, const std::string& mode, int timeout_ms) {
    return procs_.spawn("GlooProcessHelper.DISABLED_Rank",
                        {"ZEROD_COMM_HELPER_RANK=" + std::to_string(rank),
                         "ZEROD_COMM_HELPER_MODE=" + mode, "ZEROD_COMM_HELPER_DIR=" + procs_.dir(),
                         "ZEROD_COMM_HELPER_TIMEOUT_MS=" + std::to_string(timeout_ms)},
                        std::to_string(rank));
  }

  // Waits for `pid` up to `limit`; returns its wait status, or -1 if it is still running.
  int wait(pid_t pid, Ms limit) { return procs_.wait(pid, limit); }

  std::string result(int rank) { return procs_.text("result/" + std::to_string(rank)); }

 private:
  ChildProcesses procs_;
};

// Runs both ranks in `mode` to the end; both must exit 0 and report "ok".
void expect_both_ok(const std::string& mode) {
  Helpers h;
  const pid_t a = h.spawn(0, mode, 20000);
  const pid_t b = h.spawn(1, mode, 20000);
  const int sa = h.wait(a, Ms(30000));
  const int sb = h.wait(b, Ms(30000));
  ASSERT_TRUE(sa != -1 && sb != -1) << "a helper process hung";
  EXPECT_TRUE(WIFEXITED(sa) && WEXITSTATUS(sa) == 0) << "status " << sa;
  EXPECT_TRUE(WIFEXITED(sb) && WEXITSTATUS(sb) == 0) << "status " << sb;
  EXPECT_EQ(h.result(0), "ok");
  EXPECT_EQ(h.result(1), "ok");
}

// Runs both ranks in `mode`, kills rank 1 (SIGKILL) 100 ms after both reported ready, and
// returns rank 0's result once it exited: promptly (under 3 s: the closed connection is
// noticed, not the timeout), with status 0; rank 1 must have died of the signal.
std::string kill_rank_1_when_ready(const std::string& mode) {
  const int timeout_ms = 10000;
  Helpers h;
  const pid_t a = h.spawn(0, mode, timeout_ms);
  const pid_t b = h.spawn(1, mode, timeout_ms);
  h.store().wait({"ready/0", "ready/1"}, Ms(30000));
  std::this_thread::sleep_for(Ms(100));
  EXPECT_EQ(::kill(b, SIGKILL), 0);
  const auto t0 = Clock::now();
  const int sa = h.wait(a, Ms(2 * timeout_ms));
  const double ms = ms_since(t0);
  EXPECT_NE(sa, -1) << "the surviving process is still running after 2x the timeout";
  EXPECT_TRUE(WIFEXITED(sa) && WEXITSTATUS(sa) == 0) << "status " << sa;
  const std::string result = h.result(0);
  EXPECT_LT(ms, 3000.0) << result;
  const int sb = h.wait(b, Ms(1000));
  EXPECT_TRUE(WIFSIGNALED(sb) && WTERMSIG(sb) == SIGKILL) << "status " << sb;
  return result;
}

TEST(GlooProcesses, CollectivesBetweenTwoProcessesOverAFileStore) {
  expect_both_ok("collectives");
}

// Processes never read each other's memory: the shared-memory algorithm is refused at creation
// on both ranks (auto, above, goes over TCP between them).
TEST(GlooProcesses, SharedMemoryIsRefusedBetweenProcesses) {
  Helpers h;
  const pid_t a = h.spawn(0, "shared", 20000);
  const pid_t b = h.spawn(1, "shared", 20000);
  ASSERT_NE(h.wait(a, Ms(30000)), -1);
  ASSERT_NE(h.wait(b, Ms(30000)), -1);
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(contains(h.result(r), "Gloo algorithm 'shared': rank " + std::to_string(r) +
                                          " of 2 has a peer in another process"))
        << h.result(r);
  }
}

TEST(GlooProcesses, PointToPointBetweenTwoProcesses) {
  expect_both_ok("p2p");
}

// Rank 0 waits for a message when rank 1 is killed: it fails with the peer's name, the tag and
// the bytes within moments, not at its 10 s timeout.
TEST(GlooProcesses, KillingThePeerOfAWaitingReceiveFailsItPromptlyNamingIt) {
  const std::string result = kill_rank_1_when_ready("p2p_wait");
  EXPECT_EQ(result.rfind("error 3 recv #4 from rank 1 (tag 7, 1000 x f32, 4000 bytes) failed on "
                         "rank 0 of 2",
                         0),
            0u)
      << result;
}

TEST(GlooProcesses, KillingOneProcessFailsTheOtherPromptlyNamingIt) {
  // Mid-training: collectives keep running when rank 1 dies.
  const std::string result = kill_rank_1_when_ready("loop");
  EXPECT_EQ(result.rfind("error 3 all_reduce #", 0), 0u) << result;
  EXPECT_NE(result.find("rank 1"), std::string::npos) << result;
}

}  // namespace
}  // namespace zerod::test
