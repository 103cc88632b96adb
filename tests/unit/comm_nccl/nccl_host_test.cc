// The parts of the NCCL backend that run without a GPU: type and error mapping, the exchange of
// NCCL's unique id through the store (ncclGetUniqueId needs no GPU), and the refusal to create a
// communicator on a GPU this process does not see.
#include <gtest/gtest.h>

#include <cstring>

#include "comm/nccl/nccl_bootstrap.h"
#include "comm/nccl/nccl_types.h"
#include "tests/unit/comm_nccl/nccl_test_util.h"

namespace zerod::test {
namespace {

using nccl_backend::Clock;

TEST(NcclTypes, EveryCommTypeAndReduceOpMapsToItsNcclTwin) {
  using nccl_backend::nccl_op;
  using nccl_backend::nccl_type;
  EXPECT_EQ(nccl_type(CommType::kF32), ncclFloat32);
  EXPECT_EQ(nccl_type(CommType::kF64), ncclFloat64);
  EXPECT_EQ(nccl_type(CommType::kI32), ncclInt32);
  EXPECT_EQ(nccl_type(CommType::kI64), ncclInt64);
  EXPECT_EQ(nccl_type(CommType::kU8), ncclUint8);
  EXPECT_EQ(nccl_op(ReduceOp::kSum), ncclSum);
  EXPECT_EQ(nccl_op(ReduceOp::kMax), ncclMax);
  EXPECT_THROW(nccl_type(static_cast<CommType>(99)), Error);
  EXPECT_THROW(nccl_op(static_cast<ReduceOp>(99)), Error);
}

TEST(NcclErrors, RemoteAndSystemFailuresAreLostPeersTheRestInternal) {
  using nccl_backend::nccl_error_kind;
  EXPECT_EQ(nccl_error_kind(ncclRemoteError), ErrorKind::kPeerLost);
  EXPECT_EQ(nccl_error_kind(ncclSystemError), ErrorKind::kPeerLost);
  for (ncclResult_t r :
       {ncclUnhandledCudaError, ncclInternalError, ncclInvalidArgument, ncclInvalidUsage}) {
    EXPECT_EQ(nccl_error_kind(r), ErrorKind::kInternal) << r;
  }
  EXPECT_NO_THROW(nccl_backend::nccl_check(ncclSuccess, "fine"));
  try {
    nccl_backend::nccl_check(ncclRemoteError, "all_reduce #3");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kPeerLost);
    EXPECT_TRUE(contains(e.what(), "all_reduce #3: ncclRemoteError (")) << e.what();
  }
  try {
    nccl_backend::cuda_check(cudaErrorInvalidDevice, "cudaSetDevice(7)");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInternal);
    EXPECT_TRUE(contains(e.what(), "cudaSetDevice(7): CUDA error cudaErrorInvalidDevice"))
        << e.what();
  }
}

TEST(NcclBootstrap, RankZeroPublishesTheUniqueIdUnderThePrefixAndEveryRankGetsIt) {
  auto store = std::make_shared<MemoryStore>();
  constexpr int n = 3;
  std::vector<ncclUniqueId> ids(n);
  const auto deadline = Clock::now() + Ms(10000);
  run_ranks(n, [&](int r) {
    ids[static_cast<size_t>(r)] =
        nccl_backend::exchange_nccl_unique_id(*store, "job7/tp0", r, deadline);
  });
  const Bytes stored = store->get("job7/tp0/nccl_unique_id", Ms(0));
  ASSERT_EQ(stored.size(), sizeof(ncclUniqueId));
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(std::memcmp(&ids[static_cast<size_t>(r)], stored.data(), stored.size()), 0) << r;
    EXPECT_TRUE(store->check({fmt::format("job7/tp0/nccl_joined_{}", r)})) << r;
  }
  EXPECT_FALSE(store->check({"nccl_unique_id"}));  // nothing outside the prefix
}

TEST(NcclBootstrap, EmptyPrefixUsesTheBareKeys) {
  auto store = std::make_shared<MemoryStore>();
  EXPECT_EQ(nccl_backend::nccl_store_key("", "nccl_unique_id"), "nccl_unique_id");
  EXPECT_EQ(nccl_backend::nccl_store_key("a/b", "nccl_unique_id"), "a/b/nccl_unique_id");
  nccl_backend::exchange_nccl_unique_id(*store, "", 0, Clock::now() + Ms(1000));
  EXPECT_TRUE(store->check({"nccl_unique_id", "nccl_joined_0"}));
}

TEST(NcclBootstrap, RankWaitingForAMissingRankZeroTimesOutNamingIt) {
  auto store = std::make_shared<MemoryStore>();
  const auto t0 = Clock::now();
  const auto msg = peer_lost_message(
      [&] { nccl_backend::exchange_nccl_unique_id(*store, "job", 2, Clock::now() + Ms(300)); });
  const double ms = ms_since(t0);
  EXPECT_GE(ms, 250);
  EXPECT_LT(ms, 2000);
  EXPECT_TRUE(contains(msg, "rank 2: rank 0 did not publish the NCCL unique id")) << msg;
  EXPECT_TRUE(contains(msg, "'job/nccl_unique_id'")) << msg;
  EXPECT_TRUE(store->check({"job/nccl_joined_2"}));
}

TEST(NcclBootstrap, ADeadRankZeroEndsTheWaitAtOnce) {
  auto store = std::make_shared<MemoryStore>();
  LocalPeerMonitor monitor(3);
  monitor.mark_dead(0, "rank thread failed: out of GPU memory");
  const auto t0 = Clock::now();
  const auto msg = peer_lost_message([&] {
    nccl_backend::exchange_nccl_unique_id(*store, "job", 2, Clock::now() + Ms(20000), &monitor);
  });
  EXPECT_LT(ms_since(t0), 2000) << "waited for a dead rank";
  EXPECT_TRUE(contains(msg, "rank 0 is dead (rank thread failed: out of GPU memory)")) << msg;
}

TEST(NcclBootstrap, RefusesAStoredValueThatIsNotAnId) {
  auto store = std::make_shared<MemoryStore>();
  store->set("p/nccl_unique_id", Bytes{1, 2, 3});
  try {
    nccl_backend::exchange_nccl_unique_id(*store, "p", 1, Clock::now() + Ms(1000));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInternal);
    EXPECT_TRUE(contains(e.what(), "holds 3 bytes, not an NCCL unique id")) << e.what();
  }
}

TEST(NcclCreation, AGpuThisProcessDoesNotSeeIsRefused) {
  // Runs on every machine: GPU gpus() never exists (no GPU at all: GPU 0).
  auto store = std::make_shared<MemoryStore>();
  NcclOptions o = nccl_options(0, 1, store, Ms(1000));
  o.device = gpus();
  try {
    make_nccl_communicator(o);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput) << e.what();
    if (gpus() == 0) {
      EXPECT_TRUE(contains(e.what(), "needs a GPU, and this process sees none")) << e.what();
    } else {
      EXPECT_TRUE(contains(e.what(), fmt::format("GPU {} does not exist", gpus()))) << e.what();
    }
  }
  EXPECT_FALSE(store->check({"world/nccl_unique_id"}));  // refused before the rendezvous
}

TEST(NcclCreation, BadOptionsAreInternalErrors) {
  auto store = std::make_shared<MemoryStore>();
  EXPECT_THROW(make_nccl_communicator(nccl_options(2, 2, store, Ms(1000))), Error);
  EXPECT_THROW(make_nccl_communicator(nccl_options(0, 1, nullptr, Ms(1000))), Error);
  EXPECT_THROW(make_nccl_communicator(nccl_options(0, 1, store, Ms(0))), Error);
  try {
    make_nccl_communicator(nccl_options(0, 1, nullptr, Ms(1000)));
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInternal);
    EXPECT_TRUE(contains(e.what(), "needs a store")) << e.what();
  }
}

}  // namespace
}  // namespace zerod::test
