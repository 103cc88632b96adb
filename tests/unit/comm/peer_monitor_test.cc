// LocalPeerMonitor, describe_missing_ranks, and the CommType/ReduceOp names.
#include <gtest/gtest.h>

#include "comm/communicator.h"
#include "comm/peer_monitor.h"
#include "core/error.h"

namespace zerod {
namespace {

TEST(PeerMonitor, TracksProgressAndDeath) {
  LocalPeerMonitor m(3);
  m.on_start(0, 5);
  m.on_complete(0, 5);
  m.on_start(1, 6);
  m.mark_dead(2, "rank thread failed: oops");
  m.mark_dead(2, "a later, derived failure");
  const auto s = m.snapshot();
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].started, 5);
  EXPECT_EQ(s[0].completed, 5);
  EXPECT_EQ(s[1].started, 6);
  EXPECT_EQ(s[1].completed, 0);
  EXPECT_TRUE(s[0].alive);
  EXPECT_FALSE(s[2].alive);
  EXPECT_EQ(s[2].reason, "rank thread failed: oops") << "the first reason is the cause";
  EXPECT_THROW(m.on_start(3, 1), Error);
  EXPECT_THROW(m.on_start(-1, 1), Error);
}

TEST(PeerMonitor, DescribesRanksThatHadNotArrivedOrAreDead) {
  std::vector<RankProgress> ranks(5);
  ranks[0] = {182, 181, true, ""};  // self
  ranks[1] = {181, 181, true, ""};  // not there yet
  ranks[2] = {182, 180, true, ""};  // arrived (still running it)
  ranks[3] = {182, 182, false, "rank thread failed: out of memory"};
  ranks[4] = {183, 182, true, ""};  // ahead
  EXPECT_EQ(describe_missing_ranks(ranks, 182, 0),
            "rank 1 finished collective #181 but did not join #182; "
            "rank 3 is dead (rank thread failed: out of memory)");
  // Self is never listed, even when behind.
  EXPECT_EQ(describe_missing_ranks(ranks, 182, 1),
            "rank 3 is dead (rank thread failed: out of memory)");
  // Everybody there and alive: nothing to say.
  ranks[1].started = 182;
  ranks[3].alive = true;
  EXPECT_EQ(describe_missing_ranks(ranks, 182, 0), "");
  ranks[3].alive = false;
  ranks[3].reason.clear();
  EXPECT_EQ(describe_missing_ranks(ranks, 1, 0), "rank 3 is dead (no reason given)");
}

TEST(CommTypes, SizesAndNames) {
  EXPECT_EQ(comm_type_size(CommType::kF32), 4u);
  EXPECT_EQ(comm_type_size(CommType::kF64), 8u);
  EXPECT_EQ(comm_type_size(CommType::kI32), 4u);
  EXPECT_EQ(comm_type_size(CommType::kI64), 8u);
  EXPECT_EQ(comm_type_size(CommType::kU8), 1u);
  EXPECT_STREQ(comm_type_name(CommType::kF64), "f64");
  EXPECT_STREQ(comm_type_name(CommType::kU8), "u8");
  EXPECT_STREQ(reduce_op_name(ReduceOp::kSum), "sum");
  EXPECT_STREQ(reduce_op_name(ReduceOp::kMax), "max");
  EXPECT_THROW(comm_type_size(static_cast<CommType>(42)), Error);
  EXPECT_THROW(reduce_op_name(static_cast<ReduceOp>(9)), Error);
}

}  // namespace
}  // namespace zerod
