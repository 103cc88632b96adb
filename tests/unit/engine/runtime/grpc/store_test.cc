// The rendezvous key-value store and barriers, across the nodes of one world.
#include <gtest/gtest.h>

#include <atomic>
#include <set>

#include "core/timer.h"
#include "engine/runtime/grpc/channel.h"
#include "rdzv_test_util.h"
#include "zerod.grpc.pb.h"

namespace zerod {
namespace {

using namespace zerod::test;

Bytes bytes(const std::string& s) {
  return Bytes(s.begin(), s.end());
}
std::string text(const Bytes& b) {
  return std::string(b.begin(), b.end());
}

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    port_ = free_port();
    nodes_ = start_nodes({spec(3, 0, 1, port_), spec(3, 1, 1, port_), spec(3, 2, 1, port_)},
                         {options(), options(), options()});
    for (auto& n : nodes_) ASSERT_TRUE(n.session) << n.message;
  }
  void TearDown() override { close_all(nodes_); }

  NodeSession& node(int r) { return *nodes_[static_cast<size_t>(r)].session; }
  Store& store(int r) { return *node(r).store(); }

  int port_ = 0;
  std::vector<Started> nodes_;
};

TEST_F(StoreTest, ValuesSetOnOneNodeAreSeenOnTheOthers) {
  store(1).set("gloo/rank1", bytes("10.0.0.2:4000"));
  EXPECT_EQ(text(store(2).get("gloo/rank1", 1s)), "10.0.0.2:4000");
  EXPECT_EQ(text(store(0).get("gloo/rank1", 1s)), "10.0.0.2:4000");
  store(1).set("gloo/rank1", bytes("overwritten"));
  EXPECT_EQ(text(store(2).get("gloo/rank1", 1s)), "overwritten");
  const Bytes binary{0, 255, 7, 0};
  store(0).set("nccl/unique_id", binary);
  EXPECT_EQ(store(2).get("nccl/unique_id", 1s), binary);
}

TEST_F(StoreTest, GetWaitsForTheKeyToBeSet) {
  const Stopwatch watch;
  auto pending = std::async(std::launch::async, [&] { return text(store(2).get("late", 5s)); });
  std::this_thread::sleep_for(150ms);
  store(0).set("late", bytes("here"));
  EXPECT_EQ(pending.get(), "here");
  EXPECT_GE(watch.millis(), 140.0);
  EXPECT_LT(watch.millis(), 2000.0);
}

TEST_F(StoreTest, GetTimesOutNamingTheKeyAndTheTimeout) {
  const Stopwatch watch;
  try {
    store(1).get("never/set", 200ms);
    ADD_FAILURE() << "got a value";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kPeerLost);
    EXPECT_TRUE(contains(e.what(), "'never/set'")) << e.what();
    EXPECT_TRUE(contains(e.what(), "200 ms")) << e.what();
  }
  EXPECT_GE(watch.millis(), 190.0);
  EXPECT_LT(watch.millis(), 1500.0);
}

TEST_F(StoreTest, WaitNamesOnlyTheMissingKeys) {
  store(0).set("a", bytes("1"));
  store(0).wait({"a"}, 100ms);  // present: returns at once
  try {
    store(1).wait({"a", "b", "c"}, 200ms);
    ADD_FAILURE() << "wait returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kPeerLost);
    EXPECT_TRUE(contains(e.what(), "2 of 3 keys")) << e.what();
    EXPECT_TRUE(contains(e.what(), "'b', 'c'")) << e.what();
    EXPECT_FALSE(contains(e.what(), "'a'")) << e.what();
    EXPECT_FALSE(contains(e.what(), node(0).info().session_id)) << "prefix leaked: " << e.what();
  }
  auto pending = std::async(std::launch::async, [&] { store(2).wait({"a", "b", "c"}, 5s); });
  store(1).set("b", bytes(""));
  store(0).set("c", bytes("x"));
  EXPECT_EQ(pending.wait_for(2s), std::future_status::ready);
  pending.get();
}

TEST_F(StoreTest, CheckDoesNotWait) {
  EXPECT_FALSE(store(0).check({"k1"}));
  store(2).set("k1", bytes("v"));
  EXPECT_TRUE(store(0).check({"k1"}));
  EXPECT_FALSE(store(0).check({"k1", "k2"}));
}

TEST_F(StoreTest, AddIsAtomicAcrossNodes) {
  constexpr int kPerNode = 40;
  std::vector<std::future<std::vector<int64_t>>> futures;
  for (int r = 0; r < 3; ++r)
    futures.push_back(std::async(std::launch::async, [this, r] {
      std::vector<int64_t> seen;
      for (int i = 0; i < kPerNode; ++i) seen.push_back(store(r).add("counter", 1));
      return seen;
    }));
  std::set<int64_t> all;
  for (auto& f : futures)
    for (int64_t v : f.get()) all.insert(v);
  EXPECT_EQ(all.size(), 3u * kPerNode);  // every add saw a distinct value
  EXPECT_EQ(*all.begin(), 1);
  EXPECT_EQ(*all.rbegin(), 3 * kPerNode);
  EXPECT_EQ(store(1).add("counter", -5), 3 * kPerNode - 5);
  EXPECT_EQ(text(store(2).get("counter", 1s)), std::to_string(3 * kPerNode - 5));
  store(0).set("not-a-number", bytes("abc"));
  EXPECT_THROW(store(0).add("not-a-number", 1), Error);
}

TEST_F(StoreTest, KeysLiveUnderTheSessionId) {
  store(0).set("k", bytes("v"));
  auto stub =
      v1::Rendezvous::NewStub(make_rendezvous_channel("127.0.0.1:" + std::to_string(port_)));
  auto raw_get = [&](const std::string& key) {
    v1::GetRequest req;
    req.set_key(key);
    req.set_timeout_ms(0);
    v1::GetResponse resp;
    grpc::ClientContext ctx;
    prepare_context(ctx, 2s);
    EXPECT_TRUE(stub->Get(&ctx, req, &resp).ok());
    return resp;
  };
  EXPECT_FALSE(raw_get("k").found());
  const v1::GetResponse namespaced = raw_get(node(0).info().session_id + "/k");
  EXPECT_TRUE(namespaced.found());
  EXPECT_EQ(namespaced.value(), "v");
}

TEST_F(StoreTest, BarrierReleasesEveryNodeOnlyWhenTheLastArrives) {
  for (int round = 0; round < 2; ++round) {  // the same name twice: barriers are reusable
    std::atomic<bool> last_arrived{false};
    std::vector<std::future<bool>> early;
    for (int r = 0; r < 2; ++r)
      early.push_back(std::async(std::launch::async, [&, r] {
        node(r).barrier("epoch", 5s);
        return last_arrived.load();
      }));
    std::this_thread::sleep_for(150ms);
    EXPECT_EQ(early[0].wait_for(0ms), std::future_status::timeout);
    last_arrived = true;
    node(2).barrier("epoch", 5s);
    for (auto& f : early) EXPECT_TRUE(f.get()) << "a node left the barrier early";
  }
}

TEST_F(StoreTest, BarrierTimeoutNamesTheNodesThatDidNotArrive) {
  auto other = std::async(std::launch::async, [&] {
    try {
      node(1).barrier("lonely", 300ms);
    } catch (const Error&) {
    }
  });
  try {
    node(0).barrier("lonely", 300ms);
    ADD_FAILURE() << "barrier passed without node 2";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kPeerLost);
    EXPECT_TRUE(contains(e.what(), "barrier 'lonely'")) << e.what();
    EXPECT_TRUE(contains(e.what(), "node rank 2 did not arrive")) << e.what();
  }
  other.get();
}

TEST_F(StoreTest, ADeadNodeEndsWaitingCallsAtOnce) {
  const Stopwatch watch;
  auto waiting = std::async(std::launch::async, [&]() -> std::string {
    try {
      store(1).get("never", 10s);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  });
  std::this_thread::sleep_for(100ms);
  cut_heartbeat_for_testing(node(2));
  ASSERT_EQ(waiting.wait_for(3s), std::future_status::ready);
  const std::string message = waiting.get();
  EXPECT_TRUE(contains(message, "node 2")) << message;
  EXPECT_LT(watch.seconds(), 3.0);
}

}  // namespace
}  // namespace zerod
