// All-to-all and send_recv of the NCCL backend (grouped ncclSend / ncclRecv): in a world of one
// (needs 1 GPU: copies, kNoPeer, argument checks without a sequence number) and with several
// ranks as threads, one GPU each (needs >= 2 GPUs, up to 4): every type against the Gloo
// backend on the same values in host memory, and a ring that passes every block all the way
// round. Skips without GPUs.
#include <gtest/gtest.h>

#include <algorithm>

#include "comm/collective_log.h"
#include "tests/unit/comm_nccl/nccl_test_util.h"

namespace zerod::test {
namespace {

constexpr size_t kCounts[] = {0, 1, 1001, 300000};

TEST(NcclPointToPoint, WorldOfOneCopiesAndChecksArguments) {
  ZD_NEED_GPUS(1);
  auto comm =
      make_nccl_communicator(nccl_options(0, 1, std::make_shared<MemoryStore>(), Ms(30000), "one"));
  int64_t seq = 0;
  for_each_type([&](auto tag) {
    using T = decltype(tag);
    const CommType type = comm_type_of<T>();
    for (size_t count : kCounts) {
      const auto c = static_cast<int64_t>(count);
      const std::vector<T> in = values<T>(0, count);
      DeviceVec<T> send(0, in), recv(0, count);
      comm->all_to_all(send.data(), recv.data(), c, type);
      EXPECT_EQ(recv.download(), in) << comm_type_name(type) << " " << count;
      DeviceVec<T> other(0, count);
      comm->send_recv(send.data(), 0, other.data(), 0, c, type);
      EXPECT_EQ(other.download(), in) << comm_type_name(type) << " " << count;
      seq += 2;
    }
  });
  DeviceVec<float> x(0, 64);
  comm->send_recv(nullptr, kNoPeer, nullptr, kNoPeer, 8, CommType::kF32);
  ++seq;
  EXPECT_EQ(comm->sequence(), seq);
  auto internal = [](auto&& fn, const std::string& part) {
    try {
      fn();
      ADD_FAILURE() << "no error for " << part;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInternal) << e.what();
      EXPECT_TRUE(contains(e.what(), part)) << e.what();
    }
  };
  std::vector<float> host(64);
  internal([&] { comm->all_to_all_async(x.data(), x.data() + 1, 4, CommType::kF32); }, "overlap");
  internal([&] { comm->all_to_all_async(host.data(), x.data(), 4, CommType::kF32); },
           "pageable host memory");
  internal([&] { comm->send_recv_async(x.data(), 1, x.data() + 8, 0, 4, CommType::kF32); },
           "destination rank 1 outside");
  internal([&] { comm->send_recv_async(x.data(), 0, x.data() + 2, 0, 4, CommType::kF32); },
           "overlap");
  EXPECT_EQ(comm->sequence(), seq) << "rejected calls take no sequence number";
  const auto rec = comm->collective_log()->recent();
  ASSERT_FALSE(rec.empty());
  EXPECT_EQ(rec.back().op, "send_recv");
  EXPECT_EQ(rec.back().detail, "8 x f32; to nobody, from nobody");
}

int world_size() {
  return std::min(gpus(), 4);
}

TEST(NcclPointToPoint, AllToAllMatchesGloo) {
  ZD_NEED_GPUS(2);
  const int n = world_size();
  World gloo = make_world(n);
  NcclWorld nccl = make_nccl_world(n);
  run_ranks(n, [&](int r) {
    for_each_type([&](auto tag) {
      using T = decltype(tag);
      const CommType type = comm_type_of<T>();
      for (size_t count : kCounts) {
        const std::vector<T> in = values<T>(r, count * n);
        std::vector<T> want(count * n);
        for (int q = 0; q < n; ++q) {
          const auto part = values<T>(q, count, r * count);  // rank q's block for rank r
          std::copy(part.begin(), part.end(), want.begin() + q * count);
        }
        std::vector<T> host_out(count * n);
        gloo.comms[r]->all_to_all(in.data(), host_out.data(), int64_t(count), type);
        EXPECT_EQ(host_out, want);
        DeviceVec<T> send(r, in), recv(r, count * n);
        nccl.comms[r]->all_to_all(send.data(), recv.data(), int64_t(count), type);
        EXPECT_EQ(recv.download(), want) << comm_type_name(type) << " " << count << " rank " << r;
      }
    });
  });
}

TEST(NcclPointToPoint, RingPassesEveryBlockAllTheWayRound) {
  ZD_NEED_GPUS(2);
  const int n = world_size();
  NcclWorld nccl = make_nccl_world(n);
  run_ranks(n, [&](int r) {
    for_each_type([&](auto tag) {
      using T = decltype(tag);
      const CommType type = comm_type_of<T>();
      for (size_t count : kCounts) {
        DeviceVec<T> a(r, values<T>(r, count)), b(r, count);
        DeviceVec<T>* cur = &a;
        DeviceVec<T>* next = &b;
        for (int step = 1; step <= n; ++step) {
          WorkPtr w = nccl.comms[r]->send_recv_async(cur->data(), (r + 1) % n, next->data(),
                                                     (r + n - 1) % n, int64_t(count), type);
          w->wait();
          std::swap(cur, next);
          const int owner = ((r - step) % n + n) % n;
          EXPECT_EQ(cur->download(), values<T>(owner, count))
              << comm_type_name(type) << " " << count << " step " << step << " rank " << r;
        }
      }
    });
  });
}

}  // namespace
}  // namespace zerod::test
