// The NCCL backend in a world of one rank (needs 1 GPU): every collective and type against the
// host's expectation (the identity, or a copy, for one rank), the in-place forms, async works,
// ordering against a compute stream, sequence numbers and the collective log, bad arguments.
#include <gtest/gtest.h>

#include "comm/collective_log.h"
#include "tests/unit/comm_nccl/nccl_test_util.h"

namespace zerod::test {
namespace {

std::unique_ptr<Communicator> world_of_one(std::shared_ptr<Store> store = nullptr,
                                           cudaStream_t compute = nullptr) {
  if (!store) store = std::make_shared<MemoryStore>();
  NcclOptions o = nccl_options(0, 1, std::move(store), Ms(30000), "one");
  o.compute_stream = compute;
  return make_nccl_communicator(o);
}

TEST(NcclWorld1, EveryCollectiveAndTypeMatchesTheHost) {
  ZD_NEED_GPUS(1);
  auto store = std::make_shared<MemoryStore>();
  auto comm = world_of_one(store);
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  EXPECT_STREQ(comm->backend(), "nccl");
  EXPECT_EQ(store->get("one/nccl_unique_id", Ms(0)).size(), sizeof(ncclUniqueId));
  int64_t seq = 0;
  for_each_type([&](auto tag) {
    using T = decltype(tag);
    const CommType type = comm_type_of<T>();
    for (size_t count : {size_t{0}, size_t{1}, size_t{1001}, size_t{1} << 20}) {
      const auto c = static_cast<int64_t>(count);
      const std::vector<T> in = values<T>(0, count);
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
        DeviceVec<T> data(0, in);
        comm->all_reduce(data.data(), c, type, op);
        EXPECT_EQ(data.download(), in) << comm_type_name(type) << " " << count;

        DeviceVec<T> send(0, in), recv(0, count);
        comm->reduce_scatter(send.data(), recv.data(), c, type, op);
        EXPECT_EQ(recv.download(), in) << comm_type_name(type) << " " << count;
        comm->reduce_scatter(send.data(), send.data(), c, type, op);  // in place
        EXPECT_EQ(send.download(), in) << comm_type_name(type) << " " << count;
        seq += 3;
      }
      DeviceVec<T> send(0, in), recv(0, count);
      comm->all_gather(send.data(), recv.data(), c, type);
      EXPECT_EQ(recv.download(), in);
      comm->all_gather(recv.data(), recv.data(), c, type);  // in place
      EXPECT_EQ(recv.download(), in);
      comm->broadcast(send.data(), c, type, 0);
      EXPECT_EQ(send.download(), in);
      comm->barrier();
      seq += 4;
    }
  });
  EXPECT_EQ(comm->sequence(), seq);
}

TEST(NcclWorld1, AsyncWorksFinishInAnyWaitOrderAndAreLogged) {
  ZD_NEED_GPUS(1);
  auto comm = world_of_one();
  constexpr int64_t n = 1 << 20;
  DeviceVec<float> a(0, values<float>(0, n)), b(0, n);
  std::vector<WorkPtr> works;
  works.push_back(comm->all_reduce_async(a.data(), n, CommType::kF32, ReduceOp::kSum));
  works.push_back(comm->all_gather_async(a.data(), b.data(), n, CommType::kF32));
  works.push_back(comm->broadcast_async(b.data(), n, CommType::kF32, 0));
  works.push_back(comm->barrier_async());
  for (size_t i = 0; i < works.size(); ++i) EXPECT_EQ(works[i]->sequence(), int64_t(i) + 1);
  for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
  for (const auto& w : works) EXPECT_TRUE(w->done());
  EXPECT_EQ(b.download(), values<float>(0, n));

  const CollectiveLog* log = comm->collective_log();
  ASSERT_NE(log, nullptr);
  const auto rec = log->recent();
  ASSERT_EQ(rec.size(), 4u);
  EXPECT_EQ(rec[0].op, "all_reduce");
  EXPECT_EQ(rec[0].detail, fmt::format("{} x f32, sum", n));
  EXPECT_EQ(rec[0].bytes, n * 4);
  EXPECT_EQ(rec[1].detail, fmt::format("{} x f32 per rank", n));
  EXPECT_EQ(rec[3].op, "barrier");
  for (const auto& r : rec) {
    EXPECT_FALSE(r.failed);
    EXPECT_GE(r.started, r.issued);
    EXPECT_GE(r.ended, r.started);
  }
  const auto totals = log->totals();
  EXPECT_EQ(totals.at("all_reduce").calls, 1);
  EXPECT_EQ(totals.at("all_gather").bytes, n * 4);
}

TEST(NcclWorld1, DoneBecomesTrueWithoutWaiting) {
  ZD_NEED_GPUS(1);
  auto comm = world_of_one();
  DeviceVec<int64_t> x(0, values<int64_t>(0, 4096));
  WorkPtr w = comm->all_reduce_async(x.data(), 4096, CommType::kI64, ReduceOp::kMax);
  const auto t0 = std::chrono::steady_clock::now();
  while (!w->done() && ms_since(t0) < 10000) std::this_thread::sleep_for(Ms(1));
  EXPECT_TRUE(w->done());
  EXPECT_NO_THROW(w->wait());
}

TEST(NcclWorld1, CollectivesFollowTheComputeStreamAndWaitOrdersItAfterThem) {
  ZD_NEED_GPUS(1);
  nccl_backend::DeviceGuard guard(0);
  cudaStream_t compute = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), cudaSuccess);
  {
    auto comm = world_of_one(nullptr, compute);
    constexpr size_t n = size_t{64} << 20;  // 256 MB of f32: the copy takes a while
    std::vector<float> pattern = values<float>(0, n);
    DeviceVec<float> source(0, pattern), send(0, n), recv(0, n);
    std::vector<float> host(n, -1.0f);
    // Queued on the compute stream: send = source; the gather must see it, not zeros.
    ASSERT_EQ(cudaMemcpyAsync(send.data(), source.data(), n * sizeof(float),
                              cudaMemcpyDeviceToDevice, compute),
              cudaSuccess);
    WorkPtr w = comm->all_gather_async(send.data(), recv.data(), int64_t(n), CommType::kF32);
    w->wait();
    // After wait(), work queued on the compute stream sees the result.
    ASSERT_EQ(cudaMemcpyAsync(host.data(), recv.data(), n * sizeof(float), cudaMemcpyDeviceToHost,
                              compute),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
    EXPECT_EQ(host, pattern);
  }
  cudaStreamDestroy(compute);
}

TEST(NcclWorld1, BadArgumentsThrowInternalErrorsWithoutTakingASequenceNumber) {
  ZD_NEED_GPUS(1);
  auto comm = world_of_one();
  DeviceVec<float> x(0, 64);
  std::vector<float> host(64);
  auto internal = [](auto&& fn, const std::string& part) {
    try {
      fn();
      ADD_FAILURE() << "no error for " << part;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInternal) << e.what();
      EXPECT_TRUE(contains(e.what(), part)) << e.what();
    }
  };
  internal([&] { comm->all_reduce_async(x.data(), -1, CommType::kF32, ReduceOp::kSum); },
           "negative count");
  internal([&] { comm->all_reduce_async(nullptr, 4, CommType::kF32, ReduceOp::kSum); },
           "null buffer");
  internal([&] { comm->broadcast_async(x.data(), 4, CommType::kF32, 1); }, "root 1 outside");
  internal([&] { comm->all_reduce_async(host.data(), 4, CommType::kF32, ReduceOp::kSum); },
           "pageable host memory");
  internal([&] { comm->all_gather_async(x.data(), x.data() + 1, 4, CommType::kF32); },
           "send overlaps recv");
  EXPECT_EQ(comm->sequence(), 0);
  comm->barrier();  // still healthy
  EXPECT_EQ(comm->sequence(), 1);
}

}  // namespace
}  // namespace zerod::test
