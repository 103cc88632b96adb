// Joining the rendezvous: world layout, rank assignment, refusals, deadlines, bad addresses.
#include <gtest/gtest.h>

#include <set>

#include "core/timer.h"
#include "engine/runtime/grpc/rendezvous_server.h"
#include "rdzv_test_util.h"

namespace zerod {
namespace {

using namespace zerod::test;

TEST(Join, ThreeNodesWithExplicitRanksGetTheWorldLayout) {
  const int port = free_port();
  std::vector<LaunchSpec> specs;
  for (int r = 0; r < 3; ++r) specs.push_back(spec(3, r, 2, port));
  auto nodes = start_nodes(specs, {options(), options(), options()});
  for (auto& n : nodes) ASSERT_TRUE(n.session) << n.message;

  const std::string session_id = nodes[0].session->info().session_id;
  EXPECT_FALSE(session_id.empty());
  for (int r = 0; r < 3; ++r) {
    const NodeInfo& info = nodes[r].session->info();
    EXPECT_EQ(info.node_rank, r);
    EXPECT_EQ(info.nnodes, 3);
    EXPECT_EQ(info.nproc_per_node, 2);
    EXPECT_EQ(info.world_size, 6);
    EXPECT_EQ(info.first_rank, 2 * r);
    EXPECT_EQ(info.master_node_rank, 0);
    EXPECT_EQ(info.session_id, session_id);
    ASSERT_EQ(info.nodes.size(), 3u);
    for (int n = 0; n < 3; ++n) {
      EXPECT_EQ(info.nodes[n].node_rank, n);
      EXPECT_EQ(info.nodes[n].first_rank, 2 * n);
      EXPECT_EQ(info.nodes[n].address, "127.0.0.1");  // the interface facing the master
    }
  }
  EXPECT_NE(hosted_server(*nodes[0].session), nullptr);
  EXPECT_EQ(hosted_server(*nodes[1].session), nullptr);
  EXPECT_EQ(hosted_server(*nodes[2].session), nullptr);
  close_all(nodes);
}

TEST(Join, RanksLeftToTheMasterAreAssignedAndOneNodeHosts) {
  const int port = free_port();
  std::vector<std::future<Started>> futures;
  for (int i = 0; i < 3; ++i) futures.push_back(start_async(spec(3, -1, 1, port), options()));
  std::vector<Started> nodes;
  for (auto& f : futures) nodes.push_back(f.get());
  std::set<int> ranks;
  int hosts = 0;
  int host_rank = -1;
  for (auto& n : nodes) {
    ASSERT_TRUE(n.session) << n.message;
    ranks.insert(n.session->info().node_rank);
    if (hosted_server(*n.session)) {
      ++hosts;
      host_rank = n.session->info().node_rank;
    }
  }
  EXPECT_EQ(ranks, std::set<int>({0, 1, 2}));
  EXPECT_EQ(hosts, 1);  // exactly one process bound the master port
  for (auto& n : nodes) EXPECT_EQ(n.session->info().master_node_rank, host_rank);
  // Close the host last: it waits for the others to leave.
  std::sort(nodes.begin(), nodes.end(), [](const Started& a, const Started& b) {
    return hosted_server(*a.session) != nullptr && hosted_server(*b.session) == nullptr;
  });
  close_all(nodes);
}

TEST(Join, ExplicitRanksAreKeptAndTheOthersFillTheGaps) {
  const int port = free_port();
  auto server = RendezvousServer::start(server_at(port));
  // Nobody hosts: every node is a client of the server above.
  auto nodes = start_nodes({spec(3, 2, 1, port), spec(3, -1, 1, port), spec(3, -1, 1, port)},
                           {options(), options(), options()});
  for (auto& n : nodes) ASSERT_TRUE(n.session) << n.message;
  EXPECT_EQ(nodes[0].session->info().node_rank, 2);
  std::set<int> others{nodes[1].session->info().node_rank, nodes[2].session->info().node_rank};
  EXPECT_EQ(others, std::set<int>({0, 1}));
  EXPECT_EQ(nodes[0].session->info().master_node_rank, -1);
  close_all(nodes);
  server->stop();
}

// Both nodes fail fast (not at the 20 s timeout) with exit code 2 and a message that has
// both values.
void expect_refused_pair(const std::vector<LaunchSpec>& specs,
                         const std::vector<SessionOptions>& opts,
                         const std::vector<std::string>& fragments) {
  const Stopwatch watch;
  auto nodes = start_nodes(specs, opts);
  EXPECT_LT(watch.seconds(), 5.0);
  for (size_t i = 0; i < nodes.size(); ++i) {
    EXPECT_FALSE(nodes[i].session) << "node " << i << " joined";
    EXPECT_EQ(nodes[i].exit_code, 2) << nodes[i].message;
    for (const auto& f : fragments)
      EXPECT_TRUE(contains(nodes[i].message, f)) << nodes[i].message << "\nmissing: " << f;
  }
  close_all(nodes);
}

TEST(Join, DifferentJobHashesAreRefusedOnEveryNode) {
  const int port = free_port();
  SessionOptions a = options("hash-aaaa");
  SessionOptions b = options("hash-bbbb");
  a.rendezvous_timeout = b.rendezvous_timeout = 20s;
  expect_refused_pair({spec(2, 0, 1, port), spec(2, 1, 1, port)}, {a, b},
                      {"job hash", "hash-aaaa", "hash-bbbb"});
}

TEST(Join, DifferentRanksPerNodeAreRefusedOnEveryNode) {
  const int port = free_port();
  SessionOptions o = options();
  o.rendezvous_timeout = 20s;
  expect_refused_pair({spec(2, 0, 2, port), spec(2, 1, 4, port)}, {o, o},
                      {"--nproc-per-node", "runs 4 ranks", "runs 2"});
}

TEST(Join, DifferentNodeCountsAreRefusedOnEveryNode) {
  const int port = free_port();
  SessionOptions o = options();
  o.rendezvous_timeout = 20s;
  expect_refused_pair({spec(2, 0, 1, port), spec(3, 2, 1, port)}, {o, o},
                      {"--nnodes", "expects 3 nodes", "expects 2"});
}

TEST(Join, ANodeRankClaimedTwiceIsRefused) {
  const int port = free_port();
  SessionOptions o = options();
  o.rendezvous_timeout = 20s;
  expect_refused_pair({spec(3, 0, 1, port), spec(3, 1, 1, port), spec(3, 1, 1, port)}, {o, o, o},
                      {"node rank 1 was claimed twice"});
}

TEST(Join, ANodeThatNeverJoinsFailsTheOthersAtTheDeadlineNamingIt) {
  const int port = free_port();
  SessionOptions o = options();
  o.rendezvous_timeout = 600ms;
  const Stopwatch watch;
  auto nodes = start_nodes({spec(3, 0, 1, port), spec(3, 1, 1, port)}, {o, o});
  const double took = watch.seconds();
  EXPECT_GE(took, 0.5);
  EXPECT_LT(took, 3.0);
  for (auto& n : nodes) {
    EXPECT_FALSE(n.session);
    EXPECT_EQ(n.exit_code, 3) << n.message;
    EXPECT_TRUE(contains(n.message, "2 of 3 nodes joined")) << n.message;
    EXPECT_TRUE(contains(n.message, "missing node rank 2")) << n.message;
    EXPECT_TRUE(contains(n.message, "timed out")) << n.message;
  }
}

TEST(Join, AssignedRanksThatNeverCompleteSayHowManyAreMissing) {
  const int port = free_port();
  SessionOptions o = options();
  o.rendezvous_timeout = 500ms;
  auto nodes = start_nodes({spec(4, 0, 1, port), spec(4, -1, 1, port)}, {o, o});
  for (auto& n : nodes) {
    EXPECT_EQ(n.exit_code, 3) << n.message;
    EXPECT_TRUE(contains(n.message, "2 nodes missing")) << n.message;
    EXPECT_TRUE(contains(n.message, "not claimed yet: 1, 2, 3")) << n.message;
  }
}

TEST(Join, ALateNodeIsRefusedWithoutFailingTheWorld) {
  const int port = free_port();
  auto nodes = start_nodes({spec(2, 0, 1, port), spec(2, 1, 1, port)}, {options(), options()});
  for (auto& n : nodes) ASSERT_TRUE(n.session) << n.message;
  Started late = start_async(spec(2, -1, 1, port), options()).get();
  EXPECT_FALSE(late.session);
  EXPECT_EQ(late.exit_code, 2);
  EXPECT_TRUE(contains(late.message, "came too late")) << late.message;
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(nodes[0].session->world_failed()) << nodes[0].session->failure_reason();
  close_all(nodes);
}

TEST(Join, AnOccupiedPortIsBadInputNamingTheAddress) {
  const int port = free_port();
  auto other = RendezvousServer::start(server_at(port));
  const Started s = start_async(spec(2, 0, 1, port), options()).get();
  EXPECT_FALSE(s.session);
  EXPECT_EQ(s.exit_code, 2);
  EXPECT_TRUE(contains(s.message, "127.0.0.1:" + std::to_string(port) + " is already in use"))
      << s.message;
  // The same for the server on its own.
  try {
    RendezvousServer::start(server_at(port));
    ADD_FAILURE() << "a second server bound the port";
  } catch (const InputError& e) {
    EXPECT_TRUE(contains(e.what(), "is already in use")) << e.what();
  }
  EXPECT_EQ(RendezvousServer::try_start(server_at(port)), nullptr);
  other->stop();
}

TEST(Join, NodeZeroMustRunOnTheMasterHost) {
  SessionOptions o = options();
  o.address = "127.0.0.1";  // no route lookup towards the foreign address
  LaunchSpec foreign = spec(2, 0, 1, 29500);
  foreign.master_host = "192.0.2.1";  // TEST-NET-1: never an address of this machine
  const Started f = start_async(foreign, o).get();
  EXPECT_FALSE(f.session);
  EXPECT_EQ(f.exit_code, 2);
  EXPECT_TRUE(contains(f.message, "192.0.2.1 is not an address of this machine")) << f.message;
}

TEST(Join, AnUnreachableMasterFailsAfterTheTimeoutNamingTheAddress) {
  const int port = free_port();  // nothing listens there
  SessionOptions o = options();
  o.rendezvous_timeout = 500ms;
  const Stopwatch watch;
  const Started s = start_async(spec(2, 1, 1, port), o).get();
  const double took = watch.seconds();
  EXPECT_FALSE(s.session);
  EXPECT_EQ(s.exit_code, 3);
  EXPECT_TRUE(contains(s.message, "127.0.0.1:" + std::to_string(port))) << s.message;
  EXPECT_TRUE(contains(s.message, "tried for 0.")) << s.message;
  EXPECT_GE(took, 0.45);
  EXPECT_LT(took, 2.5);
}

TEST(Join, AMasterThatStartsLateIsStillReached) {
  const int port = free_port();
  SessionOptions o = options();
  o.rendezvous_timeout = 5s;
  auto client = start_async(spec(2, 1, 1, port), o);
  std::this_thread::sleep_for(400ms);  // the client is retrying meanwhile
  auto host = start_async(spec(2, 0, 1, port), o);
  std::vector<Started> nodes;
  nodes.push_back(host.get());
  nodes.push_back(client.get());
  for (auto& n : nodes) ASSERT_TRUE(n.session) << n.message;
  EXPECT_EQ(nodes[1].session->info().node_rank, 1);
  close_all(nodes);
}

}  // namespace
}  // namespace zerod
