// All-to-all and send_recv of the Gloo backend, ranks as threads of this process over a
// MemoryStore on 127.0.0.1: world sizes 1-4, sizes 0, 1, 7, 1001 and 1 MB per block, every
// type (16-bit floats moved as bytes), a ring of send_recv that passes every block all the way
// round in both directions, a pipeline chain with kNoPeer ends, argument checks, and peers that
// leave or never come (kPeerLost, bounded by the timeout).
#include <gtest/gtest.h>

#include <future>

#include "comm/collective_log.h"
#include "tests/unit/comm/comm_test_util.h"

namespace zerod::test {
namespace {

using Clock = std::chrono::steady_clock;

// Rank r's block for rank p, element i, as sent by all_to_all: value<T>(r, p * count + i).
template <typename T>
std::vector<T> all_to_all_send(int r, int n, size_t count) {
  std::vector<T> send(count * n);
  for (size_t i = 0; i < send.size(); ++i) send[i] = value<T>(r, i);
  return send;
}

// Fails once with the first wrong element of got against expect(i).
template <typename T, class Expect>
void check(const std::vector<T>& got, Expect expect, const std::string& what) {
  for (size_t i = 0; i < got.size(); ++i) {
    const T e = expect(i);
    if (std::memcmp(&got[i], &e, sizeof(T)) != 0) {
      ADD_FAILURE() << what << ": element " << i << " of " << got.size() << " is " << +got[i]
                    << ", expected " << +e;
      return;
    }
  }
}

template <class F>
void for_each_type(F&& f) {
  f.template operator()<float>();
  f.template operator()<double>();
  f.template operator()<int32_t>();
  f.template operator()<int64_t>();
  f.template operator()<uint8_t>();
}

class GlooAllToAll : public ::testing::TestWithParam<int> {};

TEST_P(GlooAllToAll, EveryTypeAndSizeTransposesTheBlocks) {
  const int n = GetParam();
  World w = make_world(n, Ms(20000));
  std::vector<int64_t> issued(n);
  run_ranks(n, [&](int r) {
    Communicator& c = *w.comms[r];
    int64_t k = 0;
    for_each_type([&]<typename T>() {
      const CommType type = comm_type_of<T>();
      std::vector<size_t> counts = {0, 1, 7, 1001};
      if (std::is_same_v<T, float>) counts.push_back(size_t{1} << 18);  // 1 MB blocks
      for (size_t count : counts) {
        const auto send = all_to_all_send<T>(r, n, count);
        std::vector<T> recv(count * n, T(99));
        c.all_to_all(send.data(), recv.data(), static_cast<int64_t>(count), type);
        ++k;
        // recv block q = rank q's block r.
        check(
            recv,
            [&](size_t i) { return value<T>(static_cast<int>(i / count), r * count + i % count); },
            fmt::format("all_to_all rank {} of {}, {} x {}", r, n, count, comm_type_name(type)));
      }
    });
    // 16-bit floats move as bytes.
    std::vector<uint16_t> h(n), g(n, 0);
    for (int p = 0; p < n; ++p) h[p] = static_cast<uint16_t>(0x3f80 + 16 * r + p);
    c.all_to_all(h.data(), g.data(), 1, CommType::kBF16);
    ++k;
    for (int q = 0; q < n; ++q) EXPECT_EQ(g[q], 0x3f80 + 16 * q + r) << "bf16 block " << q;
    EXPECT_EQ(c.sequence(), k);
    issued[r] = k;
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(w.monitor->snapshot()[r].completed, issued[r]);
  // The log: one all_to_all line with its bytes (the whole exchanged buffer).
  const auto totals = w.comms[0]->collective_log()->totals();
  ASSERT_TRUE(totals.count("all_to_all"));
  EXPECT_EQ(totals.at("all_to_all").calls, issued[0]);
}

INSTANTIATE_TEST_SUITE_P(Worlds, GlooAllToAll, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return fmt::format("world{}", info.param); });

class GlooSendRecv : public ::testing::TestWithParam<int> {};

// A ring of n steps passes each rank's block all the way round, in both directions and for
// several types and sizes: after step k rank r holds rank (r -/+ k)'s block, after n steps its own.
TEST_P(GlooSendRecv, RingPassesEveryBlockAllTheWayRound) {
  const int n = GetParam();
  World w = make_world(n, Ms(20000));
  run_ranks(n, [&](int r) {
    Communicator& c = *w.comms[r];
    int64_t k = 0;
    for_each_type([&]<typename T>() {
      const CommType type = comm_type_of<T>();
      for (size_t count : {size_t{0}, size_t{1}, size_t{1001}, size_t{70001}}) {
        for (int dir : {1, -1}) {
          const int dst = (r + dir + n) % n;
          const int src = (r - dir + n) % n;
          std::vector<T> cur(count), next(count, T(77));
          for (size_t i = 0; i < count; ++i) cur[i] = value<T>(r, i);
          for (int step = 1; step <= n; ++step) {
            c.send_recv(cur.data(), dst, next.data(), src, static_cast<int64_t>(count), type);
            ++k;
            std::swap(cur, next);
            const int owner = ((r - dir * step) % n + n) % n;
            check(
                cur, [&](size_t i) { return value<T>(owner, i); },
                fmt::format("ring dir {} step {} rank {} of {}, {} x {}", dir, step, r, n, count,
                            comm_type_name(type)));
          }
        }
      }
    });
    EXPECT_EQ(c.sequence(), k);
  });
}

// Asynchronous ring steps overlap other work: the next block is in flight while the caller
// computes on the current one, and other collectives keep their order around them.
TEST_P(GlooSendRecv, AsyncRingStepsInterleaveWithCollectives) {
  const int n = GetParam();
  World w = make_world(n, Ms(20000));
  run_ranks(n, [&](int r) {
    Communicator& c = *w.comms[r];
    constexpr size_t count = 5000;
    std::vector<std::vector<float>> bufs(2, std::vector<float>(count));
    for (size_t i = 0; i < count; ++i) bufs[0][i] = value<float>(r, i);
    double checksum = 0;
    for (int step = 0; step < n; ++step) {
      std::vector<float>& cur = bufs[step % 2];
      std::vector<float>& next = bufs[(step + 1) % 2];
      WorkPtr ring = c.send_recv_async(cur.data(), (r + 1) % n, next.data(), (r + n - 1) % n, count,
                                       CommType::kF32);
      // "Compute" on the current block (read only) while the next arrives.
      for (float x : cur) checksum += x;
      float flag = 1.0f;
      WorkPtr sum = c.all_reduce_async(&flag, 1, CommType::kF32, ReduceOp::kSum);
      EXPECT_EQ(sum->sequence(), ring->sequence() + 1);
      sum->wait();
      EXPECT_TRUE(ring->done()) << "issue order";
      EXPECT_EQ(flag, float(n));
    }
    // Every block was seen once.
    double want = 0;
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < count; ++i) want += value<float>(q, i);
    EXPECT_EQ(checksum, want);
    // After n steps the own block is home.
    check(
        bufs[n % 2], [&](size_t i) { return value<float>(r, i); }, "home");
    const auto rec = c.collective_log()->recent();
    ASSERT_FALSE(rec.empty());
    EXPECT_EQ(rec.front().op, "send_recv");
    EXPECT_EQ(rec.front().detail,
              fmt::format("5000 x f32; to rank {}, from rank {}", (r + 1) % n, (r + n - 1) % n));
    EXPECT_EQ(rec.front().bytes, 5000 * 4);
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, GlooSendRecv, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return fmt::format("world{}", info.param); });

// A pipeline chain: rank 0 only sends, the last rank only receives (kNoPeer ends, null buffers
// there), every rank still takes the sequence number.
TEST(GlooSendRecvChain, NoPeerEndsOfAPipeline) {
  constexpr int n = 3;
  World w = make_world(n);
  run_ranks(n, [&](int r) {
    Communicator& c = *w.comms[r];
    constexpr size_t count = 1001;
    std::vector<int32_t> x(count);
    for (size_t i = 0; i < count; ++i) x[i] = value<int32_t>(0, i);
    // Forward: stage r passes its activation on to r + 1.
    for (int hop = 0; hop + 1 < n; ++hop) {
      const bool sends = r == hop;
      const bool receives = r == hop + 1;
      std::vector<int32_t> in(count, -1);
      c.send_recv(sends ? x.data() : nullptr, sends ? r + 1 : kNoPeer,
                  receives ? in.data() : nullptr, receives ? r - 1 : kNoPeer, count,
                  CommType::kI32);
      if (receives) x = in;
    }
    check(
        x, [&](size_t i) { return value<int32_t>(0, i); }, "chain");
    EXPECT_EQ(c.sequence(), n - 1);
  });
}

TEST(GlooPointToPointArguments, BadArgumentsThrowAtIssueWithoutASequenceNumber) {
  World w = make_world(2);
  run_ranks(2, [&](int r) {
    Communicator& c = *w.comms[r];
    std::vector<float> a(8), b(8);
    auto internal = [](auto&& fn, const std::string& part) {
      try {
        fn();
        ADD_FAILURE() << "no error for " << part;
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kInternal) << e.what();
        EXPECT_TRUE(contains(e.what(), part)) << e.what();
      }
    };
    internal([&] { c.all_to_all(a.data(), a.data() + 1, 2, CommType::kF32); }, "overlap");
    internal([&] { c.all_to_all(a.data(), b.data(), -1, CommType::kF32); }, "negative count");
    internal([&] { c.all_to_all(nullptr, b.data(), 1, CommType::kF32); }, "null buffer");
    internal([&] { c.send_recv(a.data(), 2, b.data(), 1 - r, 4, CommType::kF32); },
             "destination rank 2 outside");
    internal([&] { c.send_recv(a.data(), 1 - r, b.data(), -2, 4, CommType::kF32); },
             "source rank -2 outside");
    internal([&] { c.send_recv(a.data(), r, b.data(), 1 - r, 4, CommType::kF32); },
             "sends to rank");
    internal([&] { c.send_recv(a.data(), 1 - r, a.data() + 2, 1 - r, 4, CommType::kF32); },
             "overlap");
    internal([&] { c.send_recv(nullptr, 1 - r, b.data(), 1 - r, 4, CommType::kF32); },
             "null send buffer");
    internal([&] { c.send_recv(a.data(), 1 - r, b.data(), 1 - r, -3, CommType::kF32); },
             "negative count");
    EXPECT_EQ(c.sequence(), 0);
    // Sending to itself (and receiving from itself) is a copy.
    for (size_t i = 0; i < 8; ++i) a[i] = float(i + 10 * r);
    c.send_recv(a.data(), r, b.data(), r, 8, CommType::kF32);
    EXPECT_EQ(b, a);
    // A swap between the two ranks: the pairs match.
    c.send_recv(a.data(), 1 - r, b.data(), 1 - r, 8, CommType::kF32);
    for (size_t i = 0; i < 8; ++i) EXPECT_EQ(b[i], float(i + 10 * (1 - r)));
    EXPECT_EQ(c.sequence(), 2);
  });
}

// A rank whose communicator goes away while its peers are inside an all-to-all (it had issued
// it too, then died before its peers arrived): the others fail with kPeerLost long before their
// timeout, naming the operation and the lost rank; later calls fail at once.
TEST(GlooPointToPointFailure, PeerThatLeavesDuringAllToAllFailsItsPeersFast) {
  constexpr int n = 3;
  const Ms timeout(10000);
  World w = make_world(n, timeout);
  std::promise<void> dead;
  auto is_dead = dead.get_future().share();
  run_ranks(n, [&](int r) {
    constexpr size_t count = 20000;
    std::vector<float> send(count * n, 1.0f), recv(count * n);
    w.comms[r]->all_to_all(send.data(), recv.data(), count, CommType::kF32);  // #1: everyone
    if (r == 2) {
      WorkPtr started =
          w.comms[2]->all_to_all_async(send.data(), recv.data(), count, CommType::kF32);
      std::this_thread::sleep_for(Ms(100));  // it is waiting for the others
      w.comms[2].reset();
      EXPECT_TRUE(started->done());
      peer_lost_message([&] { started->wait(); });
      dead.set_value();
      return;
    }
    is_dead.wait();
    const auto t0 = Clock::now();
    const auto msg = peer_lost_message(
        [&] { w.comms[r]->all_to_all(send.data(), recv.data(), count, CommType::kF32); });
    EXPECT_LT(ms_since(t0), 3000.0) << msg;
    EXPECT_TRUE(contains(msg, "all_to_all #2 (20000 x f32 per rank) failed on rank")) << msg;
    EXPECT_TRUE(contains(msg, "rank 2")) << msg;
    const auto t1 = Clock::now();
    const auto later = peer_lost_message(
        [&] { w.comms[r]->send_recv(send.data(), 1 - r, recv.data(), 1 - r, 4, CommType::kF32); });
    EXPECT_LT(ms_since(t1), 100.0);
    EXPECT_TRUE(contains(later, "failed earlier")) << later;
  });
}

// A rank that never comes to a ring step: its neighbours fail within about the timeout, and the
// error names the step, both peers and the missing rank.
TEST(GlooPointToPointFailure, RankThatNeverJoinsARingStepIsNamed) {
  constexpr int n = 3;
  const Ms timeout(600);
  World w = make_world(n, timeout);
  std::promise<void> others_done;
  auto done = others_done.get_future().share();
  std::atomic<int> finished{0};
  run_ranks(n, [&](int r) {
    Communicator& c = *w.comms[r];
    std::vector<float> a(1001, float(r)), b(1001);
    const int dst = (r + 1) % n, src = (r + n - 1) % n;
    c.send_recv(a.data(), dst, b.data(), src, 1001, CommType::kF32);  // #1: everyone
    if (r == 2) {
      done.wait();
      return;
    }
    const auto t0 = Clock::now();
    const auto msg =
        peer_lost_message([&] { c.send_recv(a.data(), dst, b.data(), src, 1001, CommType::kF32); });
    EXPECT_LT(ms_since(t0), 2.0 * timeout.count() + 1500) << msg;
    EXPECT_TRUE(contains(msg, fmt::format("send_recv #2 (1001 x f32; to rank {}, from rank {}) "
                                          "failed on rank {} of 3",
                                          dst, src, r)))
        << msg;
    EXPECT_TRUE(contains(msg, "rank 2 finished collective #1 but did not join #2")) << msg;
    if (++finished == 2) others_done.set_value();
  });
}

}  // namespace
}  // namespace zerod::test
