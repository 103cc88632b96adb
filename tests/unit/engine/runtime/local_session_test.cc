#include "engine/runtime/local_session.h"

#include <gtest/gtest.h>

#include <thread>

#include "core/error.h"

namespace zerod {
namespace {

LaunchSpec one_node(int nproc) {
  LaunchSpec s;
  s.nproc_per_node = nproc;
  return s;
}

TEST(LocalSession, LaysOutTheLocalRanks) {
  auto s = start_local_session(one_node(4));
  const NodeInfo& info = s->info();
  EXPECT_EQ(info.node_rank, 0);
  EXPECT_EQ(info.nnodes, 1);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.first_rank, 0);
  ASSERT_EQ(info.nodes.size(), 1u);
  EXPECT_FALSE(info.session_id.empty());
  EXPECT_EQ(s->monitor()->snapshot().size(), 4u);
  EXPECT_FALSE(s->world_failed());
  s->barrier("one node", std::chrono::milliseconds(1));  // nothing to wait for
  s->leave("");
}

TEST(LocalSession, TheStoreIsSharedByTheRankThreads) {
  auto s = start_local_session(one_node(2));
  std::shared_ptr<Store> store = s->store();
  std::thread setter([&] { store->set("addr/1", Bytes{1, 2, 3}); });
  EXPECT_EQ(store->get("addr/1", std::chrono::seconds(5)), (Bytes{1, 2, 3}));
  setter.join();
}

TEST(LocalSession, SeveralNodesAreRefused) {
  LaunchSpec spec = one_node(1);
  spec.nnodes = 2;
  spec.source = "slurm";
  try {
    start_local_session(spec);
    ADD_FAILURE() << "accepted 2 nodes";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("2 nodes (from slurm)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("gRPC"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace zerod
