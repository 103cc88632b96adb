// Failures of the NCCL backend: creation that a rank never joins (needs 1 GPU), a collective a
// rank never joins (the watchdog times it out and aborts NCCL; needs 2 GPUs), and destroying a
// communicator with collectives in flight (needs 2 GPUs). Short timeouts; each test checks what
// the error says and how long it took.
#include <gtest/gtest.h>

#include <future>

#include "comm/collective_log.h"
#include "tests/unit/comm_nccl/nccl_test_util.h"

namespace zerod::test {
namespace {

using Clock = std::chrono::steady_clock;

TEST(NcclFailure, CreationTimesOutNamingTheRankThatNeverJoined) {
  ZD_NEED_GPUS(1);
  auto store = std::make_shared<MemoryStore>();
  const Ms timeout(1000);
  const auto t0 = Clock::now();
  // Rank 0 of 2 comes; rank 1 never does.
  const auto msg = peer_lost_message(
      [&] { make_nccl_communicator(nccl_options(0, 2, store, timeout, "lonely")); });
  const double ms = ms_since(t0);
  EXPECT_GE(ms, 950);
  EXPECT_LT(ms, timeout.count() + 5000.0) << msg;
  EXPECT_TRUE(contains(msg, "creating the NCCL communicator (rank 0 of 2, GPU 0)")) << msg;
  EXPECT_TRUE(contains(msg, "timeout 1000 ms")) << msg;
  EXPECT_TRUE(contains(msg, "rank 1 never joined (store key 'lonely/nccl_joined_1' not set)"))
      << msg;
}

TEST(NcclFailure, CollectiveARankNeverJoinsTimesOutNamingItAndTheRank) {
  ZD_NEED_GPUS(2);
  const Ms timeout(1000);
  NcclWorld w = make_nccl_world(2, timeout);
  std::promise<void> failed;
  auto has_failed = failed.get_future().share();
  run_ranks(2, [&](int r) {
    Communicator& c = *w.comms[r];
    DeviceVec<float> x(r, 1001);
    c.all_reduce(x.data(), 1001, CommType::kF32, ReduceOp::kSum);  // #1: everyone
    if (r == 1) {                                                  // rank 1 stops taking part
      has_failed.wait();
      return;
    }
    // Nobody waits at first: the watchdog alone must notice the timeout.
    const auto t0 = Clock::now();
    WorkPtr work = c.all_reduce_async(x.data(), 1001, CommType::kF32, ReduceOp::kSum);
    while (!work->done() && ms_since(t0) < timeout.count() + 5000.0) {
      std::this_thread::sleep_for(Ms(5));
    }
    const double ms = ms_since(t0);
    EXPECT_TRUE(work->done());
    EXPECT_GE(ms, timeout.count() - 50.0);
    EXPECT_LT(ms, timeout.count() + 2000.0);
    const auto msg = peer_lost_message([&] { work->wait(); });
    EXPECT_TRUE(contains(msg, "all_reduce #2 (1001 x f32, sum) failed on rank 0 of 2")) << msg;
    EXPECT_TRUE(contains(msg, "timeout 1000 ms")) << msg;
    EXPECT_TRUE(contains(msg, "rank 1 finished collective #1 but did not join #2")) << msg;

    const std::vector<CollectiveRecord> rec = c.collective_log()->recent();
    EXPECT_EQ(rec.size(), 2u);
    if (rec.size() == 2) {
      EXPECT_FALSE(rec[0].failed);
      EXPECT_EQ(rec[1].seq, 2);
      EXPECT_EQ(rec[1].bytes, 1001 * 4);
      EXPECT_TRUE(rec[1].failed);
    }

    // Broken now: later calls throw at once, and say why.
    const auto t1 = Clock::now();
    const auto later = peer_lost_message([&] { c.barrier(); });
    EXPECT_LT(ms_since(t1), 100.0);
    EXPECT_TRUE(contains(later, "failed earlier")) << later;
    EXPECT_TRUE(contains(later, "all_reduce #2")) << later;
    failed.set_value();
  });
  // Both destroyed concurrently (NCCL may synchronize the aborting ranks of a node).
  const auto t0 = Clock::now();
  w.destroy();
  EXPECT_LT(ms_since(t0), timeout.count() + 15000.0);
}

TEST(NcclFailure, WaitingOnACollectiveThatTimesOutThrowsWithinTheTimeout) {
  ZD_NEED_GPUS(2);
  const Ms timeout(800);
  NcclWorld w = make_nccl_world(2, timeout);
  std::promise<void> failed;
  auto has_failed = failed.get_future().share();
  run_ranks(2, [&](int r) {
    if (r == 1) {  // rank 1 never joins collective #1
      has_failed.wait();
      return;
    }
    DeviceVec<int64_t> v(0, 100000);
    const auto t0 = Clock::now();
    const auto msg = peer_lost_message(
        [&] { w.comms[0]->all_reduce(v.data(), 100000, CommType::kI64, ReduceOp::kMax); });
    failed.set_value();
    EXPECT_LT(ms_since(t0), timeout.count() + 2000.0) << msg;
    EXPECT_TRUE(contains(msg, "all_reduce #1 (100000 x i64, max) failed on rank 0 of 2")) << msg;
    EXPECT_TRUE(contains(msg, "rank 1 had not started any collective and did not join #1")) << msg;
  });
}

TEST(NcclFailure, DestroyingACommunicatorWithCollectivesInFlightFailsThem) {
  ZD_NEED_GPUS(2);
  const Ms timeout(30000);  // destruction must not wait for it
  NcclWorld w = make_nccl_world(2, timeout);
  run_ranks(2, [&](int r) {
    if (r == 1) {  // rank 1 joins nothing and goes away
      std::this_thread::sleep_for(Ms(300));
      w.comms[1].reset();
      return;
    }
    DeviceVec<float> x(0, 1000), y(0, 1000);
    WorkPtr running = w.comms[0]->all_reduce_async(x.data(), 1000, CommType::kF32, ReduceOp::kSum);
    WorkPtr queued = w.comms[0]->all_reduce_async(y.data(), 1000, CommType::kF32, ReduceOp::kSum);
    std::this_thread::sleep_for(Ms(50));
    EXPECT_FALSE(running->done());
    const auto t0 = Clock::now();
    w.comms[0].reset();
    EXPECT_LT(ms_since(t0), 15000.0);
    ASSERT_TRUE(running->done());
    ASSERT_TRUE(queued->done());
    const auto m1 = peer_lost_message([&] { running->wait(); });
    EXPECT_TRUE(contains(m1, "all_reduce #1 (1000 x f32, sum) did not complete on rank 0")) << m1;
    EXPECT_TRUE(contains(m1, "destroyed")) << m1;
    const auto m2 = peer_lost_message([&] { queued->wait(); });
    EXPECT_TRUE(contains(m2, "all_reduce #2")) << m2;
  });
}

}  // namespace
}  // namespace zerod::test
