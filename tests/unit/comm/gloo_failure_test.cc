// Failures of the Gloo backend, ranks as threads: a rank that never comes to creation or to a
// collective, a rank whose communicator goes away, a communicator destroyed mid-collective.
// Short timeouts; each test checks what the error says and how long it took.
#include <gtest/gtest.h>

#include <future>

#include "comm/collective_log.h"
#include "tests/unit/comm/comm_test_util.h"

namespace zerod::test {
namespace {

using Clock = std::chrono::steady_clock;

GlooOptions options(int rank, int size, std::shared_ptr<Store> store, Ms timeout,
                    std::shared_ptr<PeerMonitor> monitor = nullptr) {
  GlooOptions o;
  o.rank = rank;
  o.size = size;
  o.store = std::move(store);
  o.timeout = timeout;
  o.monitor = std::move(monitor);
  return o;
}

TEST(GlooFailure, CreationTimesOutNamingTheRanksThatNeverJoined) {
  auto store = std::make_shared<MemoryStore>();
  const Ms timeout(500);
  // Ranks 0 and 2 of 4 come; ranks 1 and 3 never do.
  run_ranks(2, [&](int i) {
    const int rank = i * 2;
    const auto t0 = Clock::now();
    const auto msg =
        peer_lost_message([&] { make_gloo_communicator(options(rank, 4, store, timeout)); });
    EXPECT_TRUE(contains(msg, "ranks 1, 3 never joined")) << msg;
    EXPECT_TRUE(contains(msg, fmt::format("rank {} of 4", rank))) << msg;
    EXPECT_TRUE(contains(msg, "timeout 500 ms")) << msg;
    const double ms = ms_since(t0);
    EXPECT_GE(ms, 450);
    EXPECT_LT(ms, 2 * timeout.count() + 500) << msg;
  });
}

TEST(GlooFailure, RankThatNeverJoinsACollectiveIsNamed) {
  constexpr int n = 3;
  const Ms timeout(600);
  World w = make_world(n, timeout);
  std::promise<void> others_done;
  auto done = others_done.get_future().share();
  std::atomic<int> finished{0};
  run_ranks(n, [&](int r) {
    Communicator& c = *w.comms[r];
    float x[1001] = {};
    c.all_reduce(x, 1001, CommType::kF32, ReduceOp::kSum);  // #1: everyone
    if (r == 2) {  // rank 2 stops taking part and just waits
      done.wait();
      return;
    }
    const auto t0 = Clock::now();
    const auto msg =
        peer_lost_message([&] { c.all_reduce(x, 1001, CommType::kF32, ReduceOp::kSum); });
    const double ms = ms_since(t0);
    EXPECT_LT(ms, 2.0 * timeout.count()) << msg;
    EXPECT_TRUE(contains(msg, "all_reduce #2 (1001 x f32, sum)")) << msg;
    EXPECT_TRUE(contains(msg, fmt::format("rank {} of 3", r))) << msg;
    EXPECT_TRUE(contains(msg, "timeout 600 ms")) << msg;
    EXPECT_TRUE(contains(msg, "rank 2 finished collective #1 but did not join #2")) << msg;
    EXPECT_FALSE(contains(msg, fmt::format("rank {} finished", 1 - r))) << msg;
    // The flight recorder: #1 finished, #2 failed, with its size.
    const std::vector<CollectiveRecord> rec = c.collective_log()->recent();
    EXPECT_EQ(rec.size(), 2u);
    if (rec.size() == 2) {
      EXPECT_EQ(rec[0].seq, 1);
      EXPECT_FALSE(rec[0].failed);
      EXPECT_GE(rec[0].ended, rec[0].started);
      EXPECT_EQ(rec[1].seq, 2);
      EXPECT_EQ(rec[1].op, "all_reduce");
      EXPECT_EQ(rec[1].bytes, 1001 * 4);
      EXPECT_TRUE(rec[1].failed);
    }
    const std::string recent = c.collective_log()->describe_recent(8);
    EXPECT_TRUE(contains(recent, "#2 all_reduce (1001 x f32, sum, 4.0 KB)")) << recent;
    EXPECT_TRUE(contains(recent, "failed at")) << recent;

    // Broken now: later calls throw at once, and say why.
    const auto t1 = Clock::now();
    const auto later = peer_lost_message([&] { c.barrier(); });
    EXPECT_LT(ms_since(t1), 100.0);
    EXPECT_TRUE(contains(later, "failed earlier")) << later;
    EXPECT_TRUE(contains(later, "all_reduce #2")) << later;
    if (++finished == 2) others_done.set_value();
  });
  const auto t0 = Clock::now();
  w.comms.clear();
  EXPECT_LT(ms_since(t0), 1000.0) << "destroying broken communicators must not wait";
}

// A hung peer (SIGSTOP, a livelock) keeps its connections open, so nothing breaks until the
// collective timeout; once the monitor learns it is dead (the rendezvous stops seeing its
// heartbeats, or its thread failed), the others abort within moments, naming it.
TEST(GlooFailure, APeerTheMonitorDeclaresDeadFailsTheOthersLongBeforeTheTimeout) {
  constexpr int n = 3;
  const Ms timeout(20000);
  World w = make_world(n, timeout);
  std::promise<void> others_done;
  auto done = others_done.get_future().share();
  std::atomic<int> finished{0};
  run_ranks(n, [&](int r) {
    Communicator& c = *w.comms[r];
    float x[64] = {};
    c.all_reduce(x, 64, CommType::kF32, ReduceOp::kSum);  // #1: everyone
    if (r == 2) {  // hangs with its connections open; the monitor declares it dead
      std::this_thread::sleep_for(Ms(300));
      w.monitor->mark_dead(2, "heartbeats stopped 2 s ago");
      done.wait();
      return;
    }
    const auto t0 = Clock::now();
    const auto msg =
        peer_lost_message([&] { c.all_reduce(x, 64, CommType::kF32, ReduceOp::kSum); });
    EXPECT_LT(ms_since(t0), 2000.0) << msg;  // not the 20 s timeout
    EXPECT_TRUE(contains(msg, "rank 2 is dead (heartbeats stopped 2 s ago)")) << msg;
    EXPECT_TRUE(contains(msg, "all_reduce #2")) << msg;
    if (++finished == 2) others_done.set_value();
  });
  w.comms.clear();
}

TEST(GlooFailure, TimeoutErrorNamesGlooReasonAndMissingRank) {
  // Two ranks; rank 1 never joins collective #1. The error carries Gloo's reason too.
  const Ms timeout(500);
  World w = make_world(2, timeout);
  std::promise<void> go;
  auto gone = go.get_future().share();
  run_ranks(2, [&](int r) {
    if (r == 1) {
      gone.wait();
      return;
    }
    std::vector<int64_t> v(100000, 1);  // ring path
    const auto msg = peer_lost_message([&] {
      w.comms[0]->all_reduce(v.data(), int64_t(v.size()), CommType::kI64, ReduceOp::kMax);
    });
    go.set_value();
    EXPECT_TRUE(contains(msg, "all_reduce #1 (100000 x i64, max) failed on rank 0 of 2")) << msg;
    EXPECT_TRUE(contains(msg, "rank 1 failed: [unbound_buffer.cc")) << msg;
    EXPECT_TRUE(contains(msg, "Timed out")) << msg;
    EXPECT_TRUE(contains(msg, "rank 1 had not started any collective and did not join #1")) << msg;
  });
}

TEST(GlooFailure, PeerWhoseCommunicatorIsDestroyedFailsTheOthersFast) {
  constexpr int n = 3;
  const Ms timeout(10000);  // the others must not wait for it
  for (bool marked : {false, true}) {
    World w = make_world(n, timeout);
    std::promise<void> dead;
    auto is_dead = dead.get_future().share();
    run_ranks(n, [&](int r) {
      std::vector<float> x(5000, 1.0f);
      for (int k = 0; k < 3; ++k)
        w.comms[r]->all_reduce(x.data(), 5000, CommType::kF32, ReduceOp::kSum);
      if (r == 1) {  // rank 1's thread "fails": its communicator goes away
        if (marked) w.monitor->mark_dead(1, "rank thread failed: boom");
        w.comms[1].reset();
        dead.set_value();
        return;
      }
      is_dead.wait();
      const auto t0 = Clock::now();
      const auto msg = peer_lost_message(
          [&] { w.comms[r]->all_reduce(x.data(), 5000, CommType::kF32, ReduceOp::kSum); });
      EXPECT_LT(ms_since(t0), 2000.0) << msg;
      EXPECT_TRUE(contains(msg, "all_reduce #4")) << msg;
      if (marked) {
        EXPECT_TRUE(contains(msg, "rank 1 is dead (rank thread failed: boom)")) << msg;
      } else {
        EXPECT_TRUE(contains(msg, "rank 1 finished collective #3 but did not join #4")) << msg;
      }
    });
  }
}

TEST(GlooFailure, DestroyingACommunicatorMidCollectiveDoesNotWait) {
  const Ms timeout(10000);
  World w = make_world(2, timeout);
  // Rank 0 starts collectives rank 1 never joins, then drops its communicator.
  std::vector<float> x(1000, 1.0f), y(1000, 1.0f);
  WorkPtr running = w.comms[0]->all_reduce_async(x.data(), 1000, CommType::kF32, ReduceOp::kSum);
  WorkPtr queued = w.comms[0]->all_reduce_async(y.data(), 1000, CommType::kF32, ReduceOp::kSum);
  std::this_thread::sleep_for(Ms(50));
  EXPECT_FALSE(running->done());
  const auto t0 = Clock::now();
  w.comms[0].reset();
  EXPECT_LT(ms_since(t0), 1000.0);
  ASSERT_TRUE(running->done());
  ASSERT_TRUE(queued->done());
  const auto msg = peer_lost_message([&] { running->wait(); });
  EXPECT_TRUE(contains(msg, "all_reduce #1")) << msg;
  EXPECT_TRUE(contains(msg, "destroyed")) << msg;
  const auto msg2 = peer_lost_message([&] { queued->wait(); });
  EXPECT_TRUE(contains(msg2, "all_reduce #2 (1000 x f32, sum) did not run")) << msg2;

  // Its peer finds out at its next collective, at once, and is told which rank it lost.
  const auto t1 = Clock::now();
  const auto msg3 = peer_lost_message([&] { w.comms[1]->barrier(); });
  EXPECT_LT(ms_since(t1), 2000.0) << msg3;
  EXPECT_TRUE(contains(msg3, "barrier #1")) << msg3;
  EXPECT_TRUE(contains(msg3, "rank 0")) << msg3;
}

TEST(GlooFailure, QueuedCollectivesFailWithTheFirstFailure) {
  const Ms timeout(300);
  World w = make_world(2, timeout);
  std::vector<float> a(10, 1.0f), b(10, 1.0f), c(10, 1.0f);
  auto w1 = w.comms[0]->all_reduce_async(a.data(), 10, CommType::kF32, ReduceOp::kSum);
  auto w2 = w.comms[0]->all_gather_async(b.data(), c.data(), 5, CommType::kF32);
  auto w3 = w.comms[0]->barrier_async();
  const auto t0 = Clock::now();
  const auto m1 = peer_lost_message([&] { w1->wait(); });
  const auto m2 = peer_lost_message([&] { w2->wait(); });
  const auto m3 = peer_lost_message([&] { w3->wait(); });
  EXPECT_LT(ms_since(t0), 2.0 * timeout.count());
  EXPECT_TRUE(contains(m1, "all_reduce #1")) << m1;
  EXPECT_TRUE(contains(m2, "all_gather #2 (5 x f32 per rank) did not run")) << m2;
  EXPECT_TRUE(contains(m2, "all_reduce #1")) << m2;
  EXPECT_TRUE(contains(m3, "barrier #3")) << m3;
}

// Ranks that disagree about a collective (a caller bug) get an error, not a crash: their
// messages never match, so both time out.
TEST(GlooFailure, MismatchedCollectivesTimeOutInsteadOfCrashing) {
  const Ms timeout(300);
  World w = make_world(2, timeout);
  run_ranks(2, [&](int r) {
    std::vector<float> x(2000, 1.0f);
    const int64_t count = r == 0 ? 1000 : 2000;
    const auto msg = peer_lost_message(
        [&] { w.comms[r]->all_reduce(x.data(), count, CommType::kF32, ReduceOp::kSum); });
    EXPECT_TRUE(contains(msg, fmt::format("all_reduce #1 ({} x f32, sum)", count))) << msg;
    EXPECT_TRUE(contains(msg, "every other rank had started it")) << msg;
  });
}

}  // namespace
}  // namespace zerod::test
