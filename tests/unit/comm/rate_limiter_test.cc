// The Gloo transport's bandwidth throttle (comm/gloo/rate_limiter.h): X bytes at R bits/s take
// at least 8X/R seconds, directly and through a world-2 all-reduce (whose ring sends every
// rank's whole buffer once), which without the throttle is far faster; and the environment
// variable's bad values are refused naming it.
#include "comm/gloo/rate_limiter.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <vector>

#include "comm_test_util.h"
#include "core/error.h"

namespace zerod {
namespace {

using gloo_backend::RateLimiter;
using namespace test;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

TEST(RateLimiter, BytesTakeAtLeastTheirTimeAtTheRate) {
  RateLimiter limiter(8e6);  // 1 MB/s
  const auto t0 = Clock::now();
  for (int i = 0; i < 20; ++i) limiter.acquire(10000);  // 200 kB: >= 0.2 s
  const double s = seconds_since(t0);
  EXPECT_GE(s, 0.2);
  EXPECT_LT(s, 0.5);
}

TEST(RateLimiter, ThrottlesAGlooAllReduce) {
  const int64_t n = 1 << 18;  // 1 MiB of floats per rank
  auto timed = [&](double rate) {
    World w = make_world(2, Ms(20000), GlooAlgorithm::kRing, 0, rate);
    std::vector<double> secs(2);
    run_ranks(2, [&](int r) {
      std::vector<float> x(static_cast<size_t>(n), 1.0f);
      const auto t0 = Clock::now();
      w.comms[static_cast<size_t>(r)]->all_reduce(x.data(), n, CommType::kF32, ReduceOp::kSum);
      secs[static_cast<size_t>(r)] = seconds_since(t0);
      EXPECT_EQ(x[static_cast<size_t>(n - 1)], 2.0f);
    });
    return std::max(secs[0], secs[1]);
  };
  const double rate = 40e6;                      // 40 Mbit/s
  const double bytes_sent = 4.0 * n;             // ring at world 2: half in each of two phases
  const double floor_s = bytes_sent * 8 / rate;  // 0.21 s
  const double throttled = timed(rate);
  EXPECT_GE(throttled, floor_s);
  EXPECT_LT(throttled, 3 * floor_s);
  EXPECT_LT(timed(0), floor_s / 3) << "unthrottled loopback is far faster";
}

TEST(RateLimiter, EnvironmentVariable) {
  ::setenv("ZEROD_GLOO_RATE_LIMIT_BPS", "1e9", 1);
  EXPECT_EQ(gloo_backend::rate_limit_from_env(), 1e9);
  for (const char* bad : {"fast", "-5", "0", "1e9x"}) {
    ::setenv("ZEROD_GLOO_RATE_LIMIT_BPS", bad, 1);
    try {
      gloo_backend::rate_limit_from_env();
      ADD_FAILURE() << bad << " accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("ZEROD_GLOO_RATE_LIMIT_BPS"), std::string::npos);
    }
  }
  ::unsetenv("ZEROD_GLOO_RATE_LIMIT_BPS");
  EXPECT_EQ(gloo_backend::rate_limit_from_env(), 0.0);
}

// ZEROD_GLOO_RATE_LIMIT_SCOPE=node: one link per process, shared by its ranks' communicators,
// pacing only the sends to other processes' ranks.
TEST(RateLimiter, NodeScopePacesOnlyOtherProcessesRanksThroughOneSharedLink) {
  RateLimiter node(8e6, 2, 2);  // this process: global ranks 2 and 3
  EXPECT_TRUE(node.applies_to(0));
  EXPECT_TRUE(node.applies_to(1));
  EXPECT_FALSE(node.applies_to(2));
  EXPECT_FALSE(node.applies_to(3));
  EXPECT_TRUE(node.applies_to(4));
  EXPECT_TRUE(RateLimiter(8e6).applies_to(0)) << "rank scope: every peer";

  const auto a = gloo_backend::make_rate_limiter(1e9, true, 0, 2);
  const auto b = gloo_backend::make_rate_limiter(1e9, true, 0, 2);
  EXPECT_EQ(a.get(), b.get()) << "one link per process";
  EXPECT_THROW(gloo_backend::make_rate_limiter(2e9, true, 0, 2), Error);
  EXPECT_NE(gloo_backend::make_rate_limiter(1e9, false, 0, 2).get(),
            gloo_backend::make_rate_limiter(1e9, false, 0, 2).get())
      << "rank scope: a bucket per communicator";

  ::unsetenv("ZEROD_GLOO_RATE_LIMIT_SCOPE");
  EXPECT_FALSE(gloo_backend::rate_limit_per_node_from_env());
  ::setenv("ZEROD_GLOO_RATE_LIMIT_SCOPE", "rank", 1);
  EXPECT_FALSE(gloo_backend::rate_limit_per_node_from_env());
  ::setenv("ZEROD_GLOO_RATE_LIMIT_SCOPE", "node", 1);
  EXPECT_TRUE(gloo_backend::rate_limit_per_node_from_env());
  ::setenv("ZEROD_GLOO_RATE_LIMIT_SCOPE", "switch", 1);
  try {
    gloo_backend::rate_limit_per_node_from_env();
    ADD_FAILURE() << "'switch' accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("ZEROD_GLOO_RATE_LIMIT_SCOPE"), std::string::npos);
  }
  ::unsetenv("ZEROD_GLOO_RATE_LIMIT_SCOPE");
}

}  // namespace
}  // namespace zerod
