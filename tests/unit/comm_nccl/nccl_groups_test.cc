// The NCCL communicators of process groups (comm/nccl/nccl_groups.h): the options a group's
// communicator is made with and its own unique id under the group's key (host only, as
// ncclGetUniqueId needs no GPU), and, with 4 GPUs, every group of a tp2 x dp2 mesh reducing
// over exactly its members.
#include <gtest/gtest.h>

#include <cstring>

#include "comm/group_monitor.h"
#include "comm/nccl/nccl_bootstrap.h"
#include "comm/nccl/nccl_groups.h"
#include "comm/process_groups.h"
#include "tests/unit/comm_nccl/nccl_test_util.h"

namespace zerod::test {
namespace {

using nccl_backend::Clock;

TEST(NcclGroups, OptionsDeriveFromTheWorldUnderTheGroupsKey) {
  auto store = std::make_shared<MemoryStore>();
  auto monitor = std::make_shared<LocalPeerMonitor>(8);
  NcclOptions world = nccl_options(5, 8, store, Ms(1234), "job7", monitor);
  const NcclOptions o = nccl_group_options(world, "pg", "tensor.4", "tensor", {4, 5}, 1);
  EXPECT_EQ(o.rank, 1);
  EXPECT_EQ(o.size, 2);
  EXPECT_EQ(o.device, 5);  // the rank's GPU stays
  EXPECT_EQ(o.timeout, Ms(1234));
  EXPECT_EQ(o.store, store);
  EXPECT_EQ(o.key_prefix, "job7/pg/tensor.4");
  EXPECT_EQ(o.group_name, "tensor");
  EXPECT_EQ(o.global_ranks, (std::vector<int>{4, 5}));
  auto* group_monitor = dynamic_cast<GroupPeerMonitor*>(o.monitor.get());
  ASSERT_NE(group_monitor, nullptr);
  EXPECT_EQ(group_monitor->global_ranks(), (std::vector<int>{4, 5}));
  // Group rank 0 is global rank 4: a death the world knows of shows in the group.
  monitor->mark_dead(4, "killed");
  EXPECT_FALSE(o.monitor->snapshot()[0].alive);
  // No world monitor, no group monitor.
  world.monitor = nullptr;
  EXPECT_EQ(nccl_group_options(world, "pg", "tensor.4", "tensor", {4, 5}, 0).monitor, nullptr);
  EXPECT_THROW(nccl_group_options(world, "pg", "tensor.4", "tensor", {4, 5}, 2), Error);
}

TEST(NcclGroups, EachGroupPublishesItsOwnUniqueId) {
  // The two tensor groups of tp2 x dp2: global ranks {0, 1} and {2, 3}.
  auto store = std::make_shared<MemoryStore>();
  std::vector<ncclUniqueId> ids(4);
  const auto deadline = Clock::now() + Ms(10000);
  run_ranks(4, [&](int r) {
    const NcclOptions world = nccl_options(r, 4, store, Ms(10000));
    const int first = r - r % 2;
    const NcclOptions o = nccl_group_options(world, "pg", fmt::format("tensor.{}", first), "tensor",
                                             {first, first + 1}, r % 2);
    ids[static_cast<size_t>(r)] =
        nccl_backend::exchange_nccl_unique_id(*o.store, o.key_prefix, o.rank, deadline);
  });
  const Bytes a = store->get("world/pg/tensor.0/nccl_unique_id", Ms(0));
  const Bytes b = store->get("world/pg/tensor.2/nccl_unique_id", Ms(0));
  ASSERT_EQ(a.size(), sizeof(ncclUniqueId));
  EXPECT_NE(a, b);
  EXPECT_EQ(std::memcmp(&ids[0], a.data(), a.size()), 0);
  EXPECT_EQ(std::memcmp(&ids[1], a.data(), a.size()), 0);
  EXPECT_EQ(std::memcmp(&ids[2], b.data(), b.size()), 0);
  EXPECT_EQ(std::memcmp(&ids[3], b.data(), b.size()), 0);
  EXPECT_TRUE(store->check({"world/pg/tensor.2/nccl_joined_0", "world/pg/tensor.2/nccl_joined_1"}));
  EXPECT_FALSE(store->check({"world/nccl_unique_id"}));  // the world's id is not touched
}

TEST(NcclGroups, TheGroupsRanksAreNamedByTheirGlobalRanksWhileWaitingForTheId) {
  // Group ranks 0 and 1 are global ranks 4 and 5; group rank 0 never publishes the id.
  auto store = std::make_shared<MemoryStore>();
  auto world_monitor = std::make_shared<LocalPeerMonitor>(8);
  const NcclOptions o = nccl_group_options(nccl_options(5, 8, store, Ms(300), "w", world_monitor),
                                           "pg", "tensor.4", "tensor", {4, 5}, 1);
  const auto late = peer_lost_message([&] {
    nccl_backend::exchange_nccl_unique_id(*o.store, o.key_prefix, o.rank, Clock::now() + Ms(300),
                                          o.monitor.get(), o.global_ranks);
  });
  EXPECT_TRUE(contains(late, "rank 5: rank 4 did not publish the NCCL unique id")) << late;
  EXPECT_TRUE(contains(late, "'w/pg/tensor.4/nccl_unique_id'")) << late;
  world_monitor->mark_dead(4, "killed");
  const auto t0 = Clock::now();
  const auto dead = peer_lost_message([&] {
    nccl_backend::exchange_nccl_unique_id(*o.store, o.key_prefix, o.rank, Clock::now() + Ms(20000),
                                          o.monitor.get(), o.global_ranks);
  });
  EXPECT_LT(ms_since(t0), 2000) << "waited for a dead rank";
  EXPECT_TRUE(contains(dead, "rank 5: waiting for the NCCL unique id: rank 4 is dead (killed)"))
      << dead;
}

TEST(NcclGroups, EveryGroupOfTensorTwoByDataTwoReducesOverItsMembers) {
  ZD_NEED_GPUS(4);
  const MeshShape shape{.data = 2, .tensor = 2};
  auto store = std::make_shared<MemoryStore>();
  auto monitor = std::make_shared<LocalPeerMonitor>(4);
  run_ranks(4, [&](int r) {
    const NcclOptions o = nccl_options(r, 4, store, Ms(30000), "world", monitor);
    auto world = make_nccl_communicator(o);
    NcclGroupFactory factory(o);
    ProcessGroups pg(Mesh(shape), r, world.get(), &factory,
                     [r](void* dst, const void* src, size_t bytes) {
                       nccl_backend::DeviceGuard guard(r);
                       nccl_backend::cuda_check(
                           cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), "self copy");
                     });
    EXPECT_EQ(&pg.world().comm(), world.get());
    EXPECT_EQ(pg.made_by_factory(), 2);
    EXPECT_STREQ(pg.tensor().comm().backend(), "nccl");
    for (const ProcessGroup& g : pg.all()) {
      DeviceVec<float> x(r, std::vector<float>{float(r + 1)});
      g.comm().all_reduce(x.data(), 1, CommType::kF32, ReduceOp::kSum);
      float sum = 0;
      for (int q : g.ranks()) sum += float(q + 1);
      EXPECT_EQ(x.download()[0], sum) << g.name() << " on rank " << r;
    }
  });
}

}  // namespace
}  // namespace zerod::test
