#include "engine/runtime/world_monitor.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace zerod {
namespace {

TEST(WorldMonitor, LocalRanksRecordProgress) {
  WorldMonitor m(/*world_size=*/6, /*first_local_rank=*/2, /*local_count=*/2);
  m.on_start(2, 5);
  m.on_complete(2, 4);
  m.on_start(3, 7);
  m.on_complete(3, 7);
  const auto local = m.local_progress();
  ASSERT_EQ(local.size(), 2u);
  EXPECT_EQ(local[0].started, 5);
  EXPECT_EQ(local[0].completed, 4);
  EXPECT_EQ(local[1].started, 7);
  EXPECT_EQ(local[1].completed, 7);
  EXPECT_THROW(m.on_start(6, 1), Error);
}

TEST(WorldMonitor, SnapshotMergesTheMastersViewWithLocalKnowledge) {
  WorldMonitor m(4, 0, 2);
  m.on_start(0, 10);
  RankProgress remote;
  remote.started = 9;
  remote.completed = 9;
  m.update_remote(2, remote);
  RankProgress stale_local;  // the master's view of a local rank is older: ignored
  stale_local.started = 1;
  m.update_remote(0, stale_local);
  const auto snap = m.snapshot();
  ASSERT_EQ(snap.size(), 4u);
  EXPECT_EQ(snap[0].started, 10);
  EXPECT_EQ(snap[2].started, 9);
  EXPECT_EQ(snap[3].started, 0);
}

TEST(WorldMonitor, DeathsAreFinalAndKeepTheirFirstReason) {
  WorldMonitor m(4, 0, 2);
  RankProgress dead;
  dead.alive = false;
  dead.reason = "node 1 died";
  m.update_remote(3, dead);
  RankProgress alive_again;
  alive_again.started = 4;
  m.update_remote(3, alive_again);
  m.mark_dead(1, "rank thread failed: boom");
  m.mark_dead(1, "second reason");
  const auto snap = m.snapshot();
  EXPECT_FALSE(snap[3].alive);
  EXPECT_EQ(snap[3].reason, "node 1 died");
  EXPECT_EQ(snap[3].started, 4);
  EXPECT_FALSE(snap[1].alive);
  EXPECT_EQ(snap[1].reason, "rank thread failed: boom");
}

TEST(WorldMonitor, UnreachableMasterMarksOnlyRemoteRanks) {
  WorldMonitor m(6, 2, 2);  // this node: ranks 2-3; the master's node: ranks 0-1
  m.mark_remote_dead(0, 4, "master unreachable");
  const auto snap = m.snapshot();
  EXPECT_FALSE(snap[0].alive);
  EXPECT_FALSE(snap[1].alive);
  EXPECT_EQ(snap[0].reason, "master unreachable");
  EXPECT_TRUE(snap[2].alive);  // local ranks are never declared dead from afar
  EXPECT_TRUE(snap[3].alive);
  EXPECT_TRUE(snap[4].alive);
}

}  // namespace
}  // namespace zerod
