// The Gloo backend's shared-memory collectives (comm/gloo/shared.cc, shared_group.h): ranks that
// are threads of one process read each other's buffers instead of sending them over loopback
// TCP. Their results are the ring's bit for bit (the same chunks, folded in the same order: what
// ranks in separate processes get), on every rank alike, in place or not, for every chunk split
// (counts below the rank count); auto gives the TCP path's bits on both sides of its thresholds;
// a rank that
// leaves a collective waits for its readers and refuses new ones; a peer that never joins is
// named after the timeout, as with TCP. (Processes never share: gloo_process_test.cc.)
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <future>
#include <random>
#include <thread>

#include "comm/gloo/gloo_communicator.h"
#include "comm/gloo/shared_group.h"
#include "tests/unit/comm/comm_test_util.h"

namespace zerod::test {
namespace {

using gloo_backend::SharedGroup;

// Rank r's random floats (the sums round differently in another order).
std::vector<float> random_floats(int r, size_t n) {
  std::mt19937 gen(1234 + static_cast<unsigned>(r));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(gen);
  return v;
}

struct Results {
  std::vector<std::vector<float>> all_reduce, reduce_scatter, reduce_scatter_in_place, all_gather,
      all_gather_in_place;
  std::vector<std::vector<int64_t>> max_i64;
};

Results run_collectives(int n, size_t count, GlooAlgorithm algorithm) {
  World w = make_world(n, Ms(10000), algorithm);
  Results out;
  for (auto* v : {&out.all_reduce, &out.reduce_scatter, &out.reduce_scatter_in_place,
                  &out.all_gather, &out.all_gather_in_place})
    v->resize(static_cast<size_t>(n));
  out.max_i64.resize(static_cast<size_t>(n));
  const int64_t c = static_cast<int64_t>(count);
  run_ranks(n, [&](int r) {
    Communicator& comm = *w.comms[static_cast<size_t>(r)];
    const size_t ru = static_cast<size_t>(r);
    std::vector<float> a = random_floats(r, count);
    comm.all_reduce(a.data(), c, CommType::kF32, ReduceOp::kSum);
    out.all_reduce[ru] = a;

    const std::vector<float> blocks = random_floats(r + 10, count * static_cast<size_t>(n));
    std::vector<float> mine(count);
    comm.reduce_scatter(blocks.data(), mine.data(), c, CommType::kF32, ReduceOp::kSum);
    out.reduce_scatter[ru] = mine;
    std::vector<float> in_place = blocks;
    comm.reduce_scatter(in_place.data(), in_place.data() + ru * count, c, CommType::kF32,
                        ReduceOp::kSum);
    out.reduce_scatter_in_place[ru].assign(in_place.begin() + ru * count,
                                           in_place.begin() + (ru + 1) * count);

    const std::vector<float> part = random_floats(r + 20, count);
    std::vector<float> all(count * static_cast<size_t>(n), 0.0f);
    comm.all_gather(part.data(), all.data(), c, CommType::kF32);
    out.all_gather[ru] = all;
    std::vector<float> gathered(count * static_cast<size_t>(n), -1.0f);
    std::copy(part.begin(), part.end(), gathered.begin() + ru * count);
    comm.all_gather(gathered.data() + ru * count, gathered.data(), c, CommType::kF32);
    out.all_gather_in_place[ru] = gathered;

    std::vector<int64_t> m(count);
    for (size_t i = 0; i < count; ++i) m[i] = value<int64_t>(r, i);
    comm.all_reduce(m.data(), c, CommType::kI64, ReduceOp::kMax);
    out.max_i64[ru] = m;
  });
  return out;
}

TEST(GlooShared, GivesTheRingsBitsOnEveryRank) {
  for (const int n : {2, 3, 4}) {
    for (const size_t count : {size_t{1}, size_t{3}, size_t{1001}, size_t{300000}}) {
      SCOPED_TRACE(fmt::format("{} ranks, {} elements", n, count));
      const Results shared = run_collectives(n, count, GlooAlgorithm::kShared);
      const Results ring = run_collectives(n, count, GlooAlgorithm::kRing);
      EXPECT_EQ(shared.all_reduce, ring.all_reduce);
      for (int r = 1; r < n; ++r) EXPECT_EQ(shared.all_reduce[r], shared.all_reduce[0]);
      EXPECT_EQ(shared.reduce_scatter, ring.reduce_scatter);
      EXPECT_EQ(shared.reduce_scatter_in_place, ring.reduce_scatter);
      EXPECT_EQ(shared.all_gather, ring.all_gather);
      EXPECT_EQ(shared.all_gather_in_place, ring.all_gather);
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < count; i += 97)
          ASSERT_EQ(shared.max_i64[r][i], expected<int64_t>(n, i, ReduceOp::kMax)) << i;
    }
  }
}

// Auto between threads (shared memory where the TCP path would take the ring) against auto
// without it (ZEROD_GLOO_SHARED=0: what ranks in separate processes run), on both sides of the
// thresholds, with 3 ranks, where the ring's order and the direct exchange's differ.
TEST(GlooShared, AutoGivesTheTcpPathsBits) {
  for (const size_t count : {size_t{1000}, size_t{40000}, size_t{200000}}) {
    const Results automatic = run_collectives(3, count, GlooAlgorithm::kAuto);
    ::setenv("ZEROD_GLOO_SHARED", "0", 1);
    const Results tcp = run_collectives(3, count, GlooAlgorithm::kAuto);
    ::unsetenv("ZEROD_GLOO_SHARED");
    EXPECT_EQ(automatic.all_reduce, tcp.all_reduce) << count;
    EXPECT_EQ(automatic.reduce_scatter, tcp.reduce_scatter) << count;
    EXPECT_EQ(automatic.reduce_scatter_in_place, tcp.reduce_scatter) << count;
    EXPECT_EQ(automatic.all_gather, tcp.all_gather) << count;
  }
}

TEST(GlooShared, APeerThatNeverJoinsIsNamedAfterTheTimeout) {
  World w = make_world(2, Ms(500), GlooAlgorithm::kShared);
  std::vector<float> x(100000, 1.0f);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = peer_lost_message(
      [&] { w.comms[0]->all_reduce(x.data(), 100000, CommType::kF32, ReduceOp::kSum); });
  EXPECT_GE(ms_since(t0), 400.0) << msg;
  EXPECT_LT(ms_since(t0), 5000.0) << msg;
  EXPECT_TRUE(contains(msg, "all_reduce #1")) << msg;
  EXPECT_TRUE(contains(msg, "rank 1")) << msg;
  EXPECT_EQ(x[0], 1.0f) << "nothing was reduced";
}

// The owner's side of a direct read: leave() waits for the readers that started, and no reader
// starts once it has left (nor on another collective's number).
TEST(GlooShared, ALeavingRankWaitsForItsReadersAndRefusesNewOnes) {
  SharedGroup group(2);
  group.enter(0, 5);
  EXPECT_FALSE(group.begin_read(0, 4)) << "another collective";
  ASSERT_TRUE(group.begin_read(0, 5));
  std::atomic<bool> left{false};
  std::thread owner([&] {
    group.leave(0);
    left = true;
  });
  std::this_thread::sleep_for(Ms(100));
  EXPECT_FALSE(left.load()) << "left while a peer was still reading its buffer";
  group.end_read(0);
  owner.join();
  EXPECT_TRUE(left.load());
  EXPECT_FALSE(group.begin_read(0, 5)) << "a read started after its owner left";
}

// A store whose get() of the shared group's id waits for `gate` first.
class GatedStore final : public Store {
 public:
  GatedStore(Store& inner, std::shared_future<void> gate) : inner_(inner), gate_(std::move(gate)) {}
  void set(const std::string& key, const Bytes& value) override { inner_.set(key, value); }
  Bytes get(const std::string& key, Millis timeout) override {
    if (key == "zerod_shared_group") gate_.wait();
    return inner_.get(key, timeout);
  }
  void wait(const std::vector<std::string>& keys, Millis timeout) override {
    inner_.wait(keys, timeout);
  }
  bool check(const std::vector<std::string>& keys) override { return inner_.check(keys); }
  int64_t add(const std::string& key, int64_t delta) override { return inner_.add(key, delta); }

 private:
  Store& inner_;
  std::shared_future<void> gate_;
};

// Rank 0 may fail and drop its communicator right after creating the group (a job refused at
// once): the ranks that look it up afterwards still get it (the table holds it until every rank
// joined).
TEST(GlooShared, RanksJoinAfterRankZeroIsGone) {
  MemoryStore store;
  std::promise<void> rank0_gone;
  const std::shared_future<void> gate = rank0_gone.get_future().share();
  SharedGroup* made = nullptr;
  std::vector<SharedGroup*> joined(3, nullptr);
  run_ranks(3, [&](int r) {
    if (r == 0) {
      std::shared_ptr<SharedGroup> g = gloo_backend::join_shared_group(store, 0, 3, Ms(5000));
      made = g.get();
      g.reset();  // rank 0 is gone before the others look the group up
      rank0_gone.set_value();
      return;
    }
    GatedStore gated(store, gate);
    joined[static_cast<size_t>(r)] = gloo_backend::join_shared_group(gated, r, 3, Ms(5000)).get();
  });
  ASSERT_NE(made, nullptr);
  EXPECT_EQ(joined[1], made);
  EXPECT_EQ(joined[2], made);
}

}  // namespace
}  // namespace zerod::test
