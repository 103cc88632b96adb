// The copy-on-update snapshot of async checkpoints: the writer gets the states as they were when
// the save began, whichever of it and the optimizer reaches a unit first.
#include "engine/train/state_snapshot.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>

namespace zerod {
namespace {

using namespace std::chrono_literals;

struct Unit {
  std::vector<float> master, m, v;
};

std::vector<Unit> make_units(int n, int64_t len) {
  std::vector<Unit> units(static_cast<size_t>(n));
  for (int u = 0; u < n; ++u)
    for (int64_t i = 0; i < len; ++i) {
      units[u].master.push_back(static_cast<float>(u * 1000 + i));
      units[u].m.push_back(static_cast<float>(-u - i));
      units[u].v.push_back(static_cast<float>(u + 0.5 * i));
    }
  return units;
}

std::vector<ShardData> shards_of(std::vector<Unit>& units) {
  std::vector<ShardData> shards;
  for (size_t u = 0; u < units.size(); ++u) {
    ShardData s;
    s.unit = static_cast<int>(u);
    s.unit_name = "u";
    s.unit_name += std::to_string(u);
    s.end = static_cast<int64_t>(units[u].master.size());
    s.master = units[u].master.data();
    s.exp_avg = units[u].m.data();
    s.exp_avg_sq = units[u].v.data();
    shards.push_back(s);
  }
  return shards;
}

void bump(Unit& u) {  // what an optimizer step does to a unit's states
  for (auto* vec : {&u.master, &u.m, &u.v})
    for (float& x : *vec) x += 1.0f;
}

TEST(StateSnapshot, WriterSeesTheStatesAsOfTheSaveWhateverReachesAUnitFirst) {
  const int n = 4;
  const int64_t len = 1000;
  std::vector<Unit> units = make_units(n, len);
  const std::vector<Unit> at_save = units;
  MemoryTracker tracker;
  StateSnapshot snap(n, &tracker);
  snap.begin(shards_of(units));

  std::promise<void> go_on;
  std::shared_future<void> go = go_on.get_future().share();
  std::promise<void> holding_unit0;
  std::vector<Unit> written(static_cast<size_t>(n));
  std::thread writer([&] {
    for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
      const ShardData d = snap.acquire(i);
      if (i == 0) {
        holding_unit0.set_value();
        go.wait();  // the optimizer arrives at unit 0 while it is being written
      }
      written[i].master.assign(d.master, d.master + len);
      written[i].m.assign(d.exp_avg, d.exp_avg + len);
      written[i].v.assign(d.exp_avg_sq, d.exp_avg_sq + len);
      snap.release(i);
    }
  });
  holding_unit0.get_future().wait();
  // Unit 3: the writer has not reached it: copied, then the live states may change.
  snap.before_update(3);
  bump(units[3]);
  EXPECT_EQ(snap.copied_bytes(), 3 * len * 4);
  EXPECT_EQ(tracker.current(MemCategory::kCheckpoint), 3 * len * 4);
  // Unit 0 is being written: the optimizer waits for it.
  std::atomic<bool> returned{false};
  std::thread step([&] {
    snap.before_update(0);
    returned = true;
    bump(units[0]);
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(returned.load());
  go_on.set_value();
  step.join();
  writer.join();
  EXPECT_TRUE(returned.load());
  for (int u = 0; u < n; ++u) {
    EXPECT_EQ(written[u].master, at_save[u].master) << "unit " << u;
    EXPECT_EQ(written[u].m, at_save[u].m) << "unit " << u;
    EXPECT_EQ(written[u].v, at_save[u].v) << "unit " << u;
  }
  EXPECT_NE(units[0].master, at_save[0].master);  // the optimizer did go on
  EXPECT_GT(snap.blocked_seconds(), 0.03);        // the wait for unit 0 is training time lost
  // After the write nothing is copied or waited for.
  const double blocked = snap.blocked_seconds();
  snap.before_update(1);
  EXPECT_EQ(snap.copied_bytes(), 3 * len * 4);
  EXPECT_EQ(snap.blocked_seconds(), blocked);

  // The next save reuses the copy buffers.
  snap.begin(shards_of(units));
  snap.before_update(3);
  EXPECT_EQ(tracker.current(MemCategory::kCheckpoint), 3 * len * 4);
  EXPECT_EQ(snap.copied_bytes(), 6 * len * 4);
  snap.abandon();
}

TEST(StateSnapshot, AWriterThatFailsReleasesAWaitingOptimizer) {
  std::vector<Unit> units = make_units(2, 10);
  StateSnapshot snap(2, nullptr);
  snap.begin(shards_of(units));
  snap.acquire(0);  // ... and the write fails before release
  auto step = std::async(std::launch::async, [&] { snap.before_update(0); });
  EXPECT_EQ(step.wait_for(50ms), std::future_status::timeout);
  snap.abandon();
  EXPECT_EQ(step.wait_for(5s), std::future_status::ready);
}

}  // namespace
}  // namespace zerod
