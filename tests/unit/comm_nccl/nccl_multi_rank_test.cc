// The NCCL backend with several ranks as threads of this process, one GPU each (needs >= 2 GPUs;
// up to 4 are used): every collective, type and operation against the Gloo backend on the same
// values in host memory and against the host's own reduction, including the in-place
// reduce-scatter and all-gather and a broadcast from every root.
#include <gtest/gtest.h>

#include <algorithm>

#include "tests/unit/comm_nccl/nccl_test_util.h"

namespace zerod::test {
namespace {

int world_size() {
  return std::min(gpus(), 4);
}

constexpr size_t kCounts[] = {0, 1, 1001, 300000};

TEST(NcclMultiRank, AllReduceMatchesGlooAndTheHost) {
  ZD_NEED_GPUS(2);
  const int n = world_size();
  World gloo = make_world(n);
  NcclWorld nccl = make_nccl_world(n);
  run_ranks(n, [&](int r) {
    for_each_type([&](auto tag) {
      using T = decltype(tag);
      const CommType type = comm_type_of<T>();
      for (size_t count : kCounts) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
          std::vector<T> host = values<T>(r, count);
          gloo.comms[r]->all_reduce(host.data(), int64_t(count), type, op);
          DeviceVec<T> dev(r, values<T>(r, count));
          nccl.comms[r]->all_reduce(dev.data(), int64_t(count), type, op);
          const std::vector<T> got = dev.download();
          EXPECT_EQ(got, host) << comm_type_name(type) << " " << count << " rank " << r;
          for (size_t i = 0; i < count; ++i) {
            if (got[i] != expected<T>(n, i, op)) {
              ADD_FAILURE() << comm_type_name(type) << " " << reduce_op_name(op) << " element "
                            << i;
              break;
            }
          }
        }
      }
    });
  });
}

TEST(NcclMultiRank, ReduceScatterMatchesGlooAndTheHostAlsoInPlace) {
  ZD_NEED_GPUS(2);
  const int n = world_size();
  World gloo = make_world(n);
  NcclWorld nccl = make_nccl_world(n);
  run_ranks(n, [&](int r) {
    for_each_type([&](auto tag) {
      using T = decltype(tag);
      const CommType type = comm_type_of<T>();
      for (size_t count : kCounts) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
          const std::vector<T> in = values<T>(r, count * n);
          std::vector<T> want(count);
          for (size_t j = 0; j < count; ++j) want[j] = expected<T>(n, r * count + j, op);
          std::vector<T> host_out(count);
          gloo.comms[r]->reduce_scatter(in.data(), host_out.data(), int64_t(count), type, op);
          EXPECT_EQ(host_out, want);

          DeviceVec<T> send(r, in), recv(r, count);
          nccl.comms[r]->reduce_scatter(send.data(), recv.data(), int64_t(count), type, op);
          EXPECT_EQ(recv.download(), host_out) << comm_type_name(type) << " " << count;

          // In place: recv = send + rank * count.
          DeviceVec<T> buf(r, in);
          T* own = buf.data() + r * count;
          nccl.comms[r]->reduce_scatter(buf.data(), own, int64_t(count), type, op);
          const std::vector<T> all = buf.download();
          EXPECT_TRUE(std::equal(want.begin(), want.end(), all.begin() + r * count))
              << "in place " << comm_type_name(type) << " " << count;
        }
      }
    });
  });
}

TEST(NcclMultiRank, AllGatherMatchesGlooAndTheHostAlsoInPlace) {
  ZD_NEED_GPUS(2);
  const int n = world_size();
  World gloo = make_world(n);
  NcclWorld nccl = make_nccl_world(n);
  run_ranks(n, [&](int r) {
    for_each_type([&](auto tag) {
      using T = decltype(tag);
      const CommType type = comm_type_of<T>();
      for (size_t count : kCounts) {
        std::vector<T> want;
        for (int q = 0; q < n; ++q) {
          const auto part = values<T>(q, count);
          want.insert(want.end(), part.begin(), part.end());
        }
        const std::vector<T> mine = values<T>(r, count);
        std::vector<T> host_out(count * n);
        gloo.comms[r]->all_gather(mine.data(), host_out.data(), int64_t(count), type);
        EXPECT_EQ(host_out, want);

        DeviceVec<T> send(r, mine), recv(r, count * n);
        nccl.comms[r]->all_gather(send.data(), recv.data(), int64_t(count), type);
        EXPECT_EQ(recv.download(), host_out) << comm_type_name(type) << " " << count;

        // In place: send = recv + rank * count.
        DeviceVec<T> buf(r, count * n);
        buf.upload(mine, r * count);
        nccl.comms[r]->all_gather(buf.data() + r * count, buf.data(), int64_t(count), type);
        EXPECT_EQ(buf.download(), want) << "in place " << comm_type_name(type) << " " << count;
      }
    });
  });
}

TEST(NcclMultiRank, BroadcastFromEveryRootAndBarrier) {
  ZD_NEED_GPUS(2);
  const int n = world_size();
  World gloo = make_world(n);
  NcclWorld nccl = make_nccl_world(n);
  run_ranks(n, [&](int r) {
    for_each_type([&](auto tag) {
      using T = decltype(tag);
      const CommType type = comm_type_of<T>();
      for (int root = 0; root < n; ++root) {
        const size_t count = 70001;
        std::vector<T> host = values<T>(r, count);
        gloo.comms[r]->broadcast(host.data(), int64_t(count), type, root);
        EXPECT_EQ(host, values<T>(root, count));
        DeviceVec<T> dev(r, values<T>(r, count));
        nccl.comms[r]->broadcast(dev.data(), int64_t(count), type, root);
        EXPECT_EQ(dev.download(), host) << comm_type_name(type) << " root " << root;
        nccl.comms[r]->barrier();
      }
    });
  });
  // Every rank saw every collective start and complete on its GPU.
  const int64_t last = nccl.comms[0]->sequence();
  for (const RankProgress& p : nccl.monitor->snapshot()) {
    EXPECT_EQ(p.started, last);
    EXPECT_EQ(p.completed, last);
  }
}

TEST(NcclMultiRank, ManyAsyncCollectivesInFlight) {
  ZD_NEED_GPUS(2);
  const int n = world_size();
  NcclWorld nccl = make_nccl_world(n);
  run_ranks(n, [&](int r) {
    constexpr int k = 32;
    constexpr size_t count = 4099;
    std::vector<std::unique_ptr<DeviceVec<float>>> bufs;
    std::vector<WorkPtr> works;
    for (int i = 0; i < k; ++i) {
      bufs.push_back(std::make_unique<DeviceVec<float>>(r, values<float>(r, count)));
      works.push_back(nccl.comms[r]->all_reduce_async(bufs.back()->data(), int64_t(count),
                                                      CommType::kF32, ReduceOp::kSum));
    }
    for (auto& w : works) w->wait();
    for (const auto& b : bufs) {
      const auto got = b->download();
      for (size_t i = 0; i < count; ++i) {
        if (got[i] != expected<float>(n, i, ReduceOp::kSum)) {
          ADD_FAILURE() << "rank " << r << " element " << i;
          break;
        }
      }
    }
    EXPECT_EQ(nccl.comms[r]->sequence(), k);
  });
}

}  // namespace
}  // namespace zerod::test
