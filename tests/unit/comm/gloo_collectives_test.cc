// Every collective of the Gloo backend, ranks as threads of this process over a MemoryStore on
// 127.0.0.1: world sizes 1-4, sizes 0, 1, 7, 1001 (not divisible by 2, 3 or 4) and 3 MB, every
// type and reduction, in place and out of place, each algorithm; values checked element by
// element against values computed here.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <random>

#include "tests/unit/comm/comm_test_util.h"

namespace zerod::test {
namespace {

constexpr size_t kBig = 786432;  // 3 MB of f32

// Fails once per call with the first mismatch and the number of mismatches.
template <typename T, class Expect>
void check_elements(const T* got, size_t n, Expect expect, const std::string& what) {
  size_t bad = 0;
  size_t first = 0;
  for (size_t i = 0; i < n; ++i) {
    const T e = expect(i);
    if (std::memcmp(&got[i], &e, sizeof(T)) != 0) {
      if (bad++ == 0) first = i;
    }
  }
  if (bad > 0) {
    ADD_FAILURE() << what << ": " << bad << " of " << n << " elements wrong; first at " << first
                  << ": got " << +got[first] << ", expected " << +expect(first);
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

struct Config {
  int world;
  GlooAlgorithm algorithm;
  size_t segment_bytes;  // 0: default
  bool big;              // include the 3 MB size
};

std::string config_name(const ::testing::TestParamInfo<Config>& info) {
  const auto& c = info.param;
  return fmt::format("world{}_{}{}{}", c.world, gloo_algorithm_name(c.algorithm),
                     c.segment_bytes ? fmt::format("_seg{}", c.segment_bytes) : "",
                     c.big ? "_big" : "");
}

class GlooCollectives : public ::testing::TestWithParam<Config> {};

// One rank's share of the sweep; returns the number of collectives it issued.
int64_t sweep(Communicator& c, bool big) {
  const int n = c.size();
  const int r = c.rank();
  int64_t issued = 0;
  std::vector<size_t> counts = {0, 1, 7, 1001};
  if (big) counts.push_back(kBig);
  for_each_type([&]<typename T>() {
    const CommType type = comm_type_of<T>();
    const std::string tname = comm_type_name(type);
    for (size_t count : counts) {
      const bool is_big = count == kBig;
      const bool reduce_big = std::is_same_v<T, float>;  // 3 MB reductions in f32 only
      const bool bytes_big = reduce_big || std::is_same_v<T, uint8_t>;
      const auto cnt = static_cast<int64_t>(count);
      const std::string at = fmt::format("rank {} of {}, {} x {}", r, n, count, tname);

      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
        if (is_big && !reduce_big) continue;
        const std::string opn = reduce_op_name(op);
        // all-reduce (in place)
        std::vector<T> data(count);
        for (size_t i = 0; i < count; ++i) data[i] = value<T>(r, i);
        c.all_reduce(data.data(), cnt, type, op);
        ++issued;
        check_elements(
            data.data(), count, [&](size_t i) { return expected<T>(n, i, op); },
            "all_reduce " + opn + " " + at);

        // reduce-scatter, out of place and in place
        std::vector<T> send(count * n);
        for (size_t i = 0; i < send.size(); ++i) send[i] = value<T>(r, i);
        std::vector<T> recv(count, T(99));
        c.reduce_scatter(send.data(), recv.data(), cnt, type, op);
        ++issued;
        auto rs_expect = [&](size_t i) { return expected<T>(n, r * count + i, op); };
        check_elements(recv.data(), count, rs_expect, "reduce_scatter " + opn + " " + at);
        c.reduce_scatter(send.data(), send.data() + r * count, cnt, type, op);
        ++issued;
        check_elements(send.data() + r * count, count, rs_expect,
                       "reduce_scatter in place " + opn + " " + at);
      }

      if (is_big && !bytes_big) continue;
      // all-gather, out of place and in place
      std::vector<T> mine(count);
      for (size_t i = 0; i < count; ++i) mine[i] = value<T>(r, i);
      std::vector<T> all(count * n, T(77));
      c.all_gather(mine.data(), all.data(), cnt, type);
      ++issued;
      auto ag_expect = [&](size_t i) { return value<T>(static_cast<int>(i / count), i % count); };
      check_elements(all.data(), all.size(), ag_expect, "all_gather " + at);
      std::vector<T> inplace(count * n, T(55));
      std::copy(mine.begin(), mine.end(), inplace.begin() + r * count);
      c.all_gather(inplace.data() + r * count, inplace.data(), cnt, type);
      ++issued;
      check_elements(inplace.data(), inplace.size(), ag_expect, "all_gather in place " + at);

      // broadcast from one root (every root for the small sizes)
      for (int root = 0; root < n; ++root) {
        if (count > 7 && root != static_cast<int>(count % n)) continue;
        std::vector<T> b(count);
        for (size_t i = 0; i < count; ++i) b[i] = value<T>(r == root ? root : r + 7, i);
        c.broadcast(b.data(), cnt, type, root);
        ++issued;
        check_elements(
            b.data(), count, [&](size_t i) { return value<T>(root, i); },
            fmt::format("broadcast root {} {}", root, at));
      }
    }
  });
  return issued;
}

TEST_P(GlooCollectives, EveryOpTypeAndSize) {
  const Config& cfg = GetParam();
  World w = make_world(cfg.world, Ms(20000), cfg.algorithm, cfg.segment_bytes);
  std::vector<int64_t> issued(cfg.world);
  run_ranks(cfg.world, [&](int r) {
    Communicator& c = *w.comms[r];
    EXPECT_EQ(c.rank(), r);
    EXPECT_EQ(c.size(), cfg.world);
    EXPECT_STREQ(c.backend(), "gloo");
    issued[r] = sweep(c, cfg.big);
    // Every collective took the next sequence number.
    EXPECT_EQ(c.sequence(), issued[r]);
  });
  for (int r = 0; r < cfg.world; ++r) {
    const auto p = w.monitor->snapshot()[r];
    EXPECT_EQ(p.started, issued[r]) << "rank " << r;
    EXPECT_EQ(p.completed, issued[r]) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Sweep, GlooCollectives,
    ::testing::Values(
        Config{1, GlooAlgorithm::kAuto, 0, true}, Config{2, GlooAlgorithm::kAuto, 0, true},
        Config{3, GlooAlgorithm::kAuto, 0, true}, Config{4, GlooAlgorithm::kAuto, 0, true},
        // kAuto sends the small sizes directly and runs the ring on the 3 MB
        // one; tiny ring segments run the ring on the small sizes too, with many
        // segments per chunk and the staging slots reused many times.
        Config{3, GlooAlgorithm::kRing, 64, false}, Config{4, GlooAlgorithm::kRing, 200, false},
        // Gloo's own all-reduce and all-gather (for comparison in the benchmark).
        Config{3, GlooAlgorithm::kGloo, 0, false}),
    config_name);

// Several collectives in flight at once, waited for in reverse order: each has the next
// sequence number, each result is right, and they complete in issue order.
TEST(GlooAsync, InFlightCollectivesWaitedOutOfOrder) {
  constexpr int n = 3;
  World w = make_world(n);
  run_ranks(n, [&](int r) {
    Communicator& c = *w.comms[r];
    c.barrier();
    const int64_t base = c.sequence();
    constexpr size_t count = 20000;
    std::vector<float> a(count), b(count);
    std::vector<int32_t> rs_send(count * n), rs_recv(count);
    std::vector<uint8_t> ag_mine(count), ag_all(count * n);
    std::vector<double> bc(count);
    for (size_t i = 0; i < count; ++i) {
      a[i] = value<float>(r, i);
      b[i] = value<float>(r, i + 5);
      ag_mine[i] = value<uint8_t>(r, i);
      bc[i] = r == 1 ? value<double>(1, i) : -1.0;
    }
    for (size_t i = 0; i < rs_send.size(); ++i) rs_send[i] = value<int32_t>(r, i);

    std::vector<WorkPtr> works;
    works.push_back(c.all_reduce_async(a.data(), count, CommType::kF32, ReduceOp::kSum));
    works.push_back(c.reduce_scatter_async(rs_send.data(), rs_recv.data(), count, CommType::kI32,
                                           ReduceOp::kMax));
    works.push_back(c.all_gather_async(ag_mine.data(), ag_all.data(), count, CommType::kU8));
    works.push_back(c.broadcast_async(bc.data(), count, CommType::kF64, 1));
    works.push_back(c.all_reduce_async(b.data(), count, CommType::kF32, ReduceOp::kMax));
    works.push_back(c.barrier_async());
    EXPECT_EQ(c.sequence(), base + 6);
    for (size_t k = 0; k < works.size(); ++k)
      EXPECT_EQ(works[k]->sequence(), base + 1 + int64_t(k));

    works.back()->wait();
    for (auto& wk : works) EXPECT_TRUE(wk->done()) << "issue order: all earlier ones are done";
    for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();

    check_elements(
        a.data(), count, [&](size_t i) { return expected<float>(n, i, ReduceOp::kSum); },
        "async all_reduce sum");
    check_elements(
        b.data(), count,
        [&](size_t i) {
          float m = value<float>(0, i + 5);
          for (int q = 1; q < n; ++q) m = std::max(m, value<float>(q, i + 5));
          return m;
        },
        "async all_reduce max");
    check_elements(
        rs_recv.data(), count,
        [&](size_t i) { return expected<int32_t>(n, r * count + i, ReduceOp::kMax); },
        "async reduce_scatter");
    check_elements(
        ag_all.data(), ag_all.size(),
        [&](size_t i) { return value<uint8_t>(int(i / count), i % count); }, "async all_gather");
    check_elements(
        bc.data(), count, [&](size_t i) { return value<double>(1, i); }, "async broadcast");
  });
}

// No rank leaves a barrier before every rank has entered it.
TEST(GlooBarrier, NoRankLeavesEarly) {
  constexpr int n = 4;
  constexpr int rounds = 20;
  World w = make_world(n);
  std::atomic<int> entered{0};
  run_ranks(n, [&](int r) {
    for (int k = 0; k < rounds; ++k) {
      if (r == k % n) std::this_thread::sleep_for(Ms(2));  // a late rank, a different one each time
      entered.fetch_add(1);
      w.comms[r]->barrier();
      EXPECT_GE(entered.load(), n * (k + 1)) << "rank " << r << " left barrier " << k << " early";
    }
  });
}

// A NaN on one rank makes the max NaN on every rank (overflow flags rely on it).
TEST(GlooReduce, MaxPropagatesNaN) {
  constexpr int n = 3;
  World w = make_world(n);
  run_ranks(n, [&](int r) {
    std::vector<float> f = {1.0f, float(r), -5.0f, float(r) * 2};
    std::vector<double> d = {1.0, double(r), -5.0, double(r) * 2};
    if (r == 1) {
      f[2] = std::numeric_limits<float>::quiet_NaN();
      d[0] = std::numeric_limits<double>::quiet_NaN();
    }
    w.comms[r]->all_reduce(f.data(), 4, CommType::kF32, ReduceOp::kMax);
    w.comms[r]->all_reduce(d.data(), 4, CommType::kF64, ReduceOp::kMax);
    EXPECT_EQ(f[0], 1.0f);
    EXPECT_EQ(f[1], float(n - 1));
    EXPECT_TRUE(std::isnan(f[2])) << "rank " << r;
    EXPECT_EQ(f[3], float(2 * (n - 1)));
    EXPECT_TRUE(std::isnan(d[0])) << "rank " << r;
    EXPECT_EQ(d[3], double(2 * (n - 1)));
  });
}

// Sums of non-integer floats: every rank gets the same bits (a data-parallel step depends on
// it), close to the exact sum.
TEST(GlooReduce, FloatSumIsBitIdenticalOnEveryRank) {
  constexpr int n = 3;
  for (auto algorithm : {GlooAlgorithm::kAuto, GlooAlgorithm::kRing, GlooAlgorithm::kDirect}) {
    World w = make_world(n, Ms(10000), algorithm, algorithm == GlooAlgorithm::kRing ? 4096 : 0);
    constexpr size_t count = 100003;
    std::vector<std::vector<float>> in(n, std::vector<float>(count));
    for (int r = 0; r < n; ++r) {
      std::mt19937 rng(100 + r);
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      for (auto& x : in[r]) x = u(rng);
    }
    std::vector<std::vector<float>> out = in;
    run_ranks(n, [&](int r) {
      w.comms[r]->all_reduce(out[r].data(), count, CommType::kF32, ReduceOp::kSum);
    });
    for (int r = 1; r < n; ++r) {
      EXPECT_EQ(std::memcmp(out[0].data(), out[r].data(), count * sizeof(float)), 0)
          << gloo_algorithm_name(algorithm) << ": rank " << r << " differs from rank 0";
    }
    for (size_t i = 0; i < count; i += 997) {
      double exact = 0;
      for (int r = 0; r < n; ++r) exact += in[r][i];
      EXPECT_NEAR(out[0][i], exact, 1e-5) << "element " << i;
    }
  }
}

TEST(GlooArguments, BadArgumentsThrowAtIssue) {
  World w = make_world(2);
  run_ranks(2, [&](int r) {
    Communicator& c = *w.comms[r];
    float x = 0;
    try {
      c.all_reduce(&x, -1, CommType::kF32, ReduceOp::kSum);
      ADD_FAILURE() << "negative count accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInternal);
      EXPECT_NE(std::string(e.what()).find("negative count -1"), std::string::npos) << e.what();
    }
    EXPECT_THROW(c.broadcast(&x, 1, CommType::kF32, 2), Error);
    EXPECT_THROW(c.all_gather(nullptr, &x, 1, CommType::kF32), Error);
    uint16_t h[2] = {1, 2};
    EXPECT_THROW(c.all_reduce(h, 2, CommType::kBF16, ReduceOp::kSum), Error);
    EXPECT_THROW(c.reduce_scatter(h, h + r, 1, CommType::kF16, ReduceOp::kSum), Error);
    EXPECT_EQ(c.sequence(), 0) << "rejected calls take no sequence number";
    uint16_t mine = static_cast<uint16_t>(0x3f80 + r), all[2] = {0, 0};
    c.all_gather(&mine, all, 1, CommType::kBF16);  // 16-bit floats move as bytes
    EXPECT_EQ(all[0], 0x3f80);
    EXPECT_EQ(all[1], 0x3f81);
    EXPECT_EQ(c.sequence(), 1);
    c.barrier();  // still usable
    EXPECT_EQ(c.sequence(), 2);
  });
}

}  // namespace
}  // namespace zerod::test
