// Heartbeats: progress travels, dead and silent nodes are detected, leaving cleanly or not.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>

#include "core/timer.h"
#include "engine/runtime/grpc/channel.h"
#include "engine/runtime/grpc/rendezvous_server.h"
#include "rdzv_test_util.h"
#include "zerod.grpc.pb.h"

namespace zerod {
namespace {

using namespace zerod::test;

std::vector<Started> start_world(int nnodes, int nproc, int port) {
  std::vector<LaunchSpec> specs;
  std::vector<SessionOptions> opts;
  for (int r = 0; r < nnodes; ++r) {
    specs.push_back(spec(nnodes, r, nproc, port));
    opts.push_back(options());
  }
  auto nodes = start_nodes(specs, opts);
  for (auto& n : nodes) EXPECT_TRUE(n.session) << n.message;
  return nodes;
}

v1::NodeState state_of(RendezvousServer& server, int node_rank) {
  for (const auto& n : server.service().node_states())
    if (n.node_rank() == node_rank) return n.state();
  return v1::NODE_STATE_UNSPECIFIED;
}

TEST(Heartbeat, ProgressTravelsToTheOtherNodes) {
  auto nodes = start_world(2, 2, free_port());
  ASSERT_TRUE(nodes[0].session && nodes[1].session);
  auto m1 = nodes[1].session->monitor();
  m1->on_start(2, 17);
  m1->on_complete(2, 16);
  m1->on_start(3, 17);
  auto m0 = nodes[0].session->monitor();
  EXPECT_TRUE(eventually(
      [&] {
        const auto s = m0->snapshot();
        return s[2].started == 17 && s[2].completed == 16 && s[3].started == 17;
      },
      2s));
  EXPECT_FALSE(nodes[0].session->world_failed());
  close_all(nodes);
}

TEST(Heartbeat, ABrokenStreamIsADeadNodeWithinASecond) {
  const int port = free_port();
  auto nodes = start_world(3, 1, port);
  for (auto& n : nodes) ASSERT_TRUE(n.session);
  std::mutex mu;
  std::vector<std::string> callbacks;
  nodes[1].session->on_world_failure([&](const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    callbacks.push_back(why);
  });
  RendezvousServer* server = hosted_server(*nodes[0].session);
  ASSERT_NE(server, nullptr);

  std::this_thread::sleep_for(100ms);  // mid-training: node 2 has been beating for a while
  const Stopwatch watch;
  cut_heartbeat_for_testing(*nodes[2].session);  // what a crash looks like to the master
  ASSERT_TRUE(eventually([&] { return state_of(*server, 2) == v1::NODE_STATE_DEAD; }, 2s));
  const double master_saw = watch.seconds();
  ASSERT_TRUE(eventually([&] { return nodes[1].session->world_failed(); }, 2s));
  EXPECT_LT(master_saw, 1.0);

  const std::string reason = nodes[1].session->failure_reason();
  EXPECT_TRUE(contains(reason, "node 2 (rank 2")) << reason;
  EXPECT_TRUE(contains(reason, "heartbeat stream broke")) << reason;
  ASSERT_TRUE(eventually([&] { return nodes[0].session->world_failed(); }, 2s));
  EXPECT_THROW(nodes[0].session->check_world(), Error);
  const auto snap = nodes[1].session->monitor()->snapshot();
  EXPECT_FALSE(snap[2].alive);
  EXPECT_TRUE(snap[0].alive);
  EXPECT_TRUE(snap[1].alive);
  // (The session marks itself failed, then calls its callbacks outside its lock: wait for it.)
  ASSERT_TRUE(eventually(
      [&] {
        std::lock_guard<std::mutex> lock(mu);
        return !callbacks.empty();
      },
      2s));
  std::this_thread::sleep_for(50ms);  // a second call, if there were one, would come by now
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_EQ(callbacks.size(), 1u);
    EXPECT_EQ(callbacks[0], reason);
  }
  // Registering after the failure calls back at once.
  bool late = false;
  nodes[1].session->on_world_failure([&](const std::string&) { late = true; });
  EXPECT_TRUE(late);
  close_all(nodes);
}

TEST(Heartbeat, ASilentNodeIsDeclaredDeadAfterAFewBeats) {
  const int port = free_port();
  auto host = start_async(spec(2, 0, 1, port), options());
  // Node 1 joins by hand and never opens its heartbeat stream.
  auto stub = v1::Rendezvous::NewStub(make_rendezvous_channel("127.0.0.1:" + std::to_string(port)));
  ASSERT_TRUE(eventually(
      [&] {
        v1::JoinRequest req;
        req.set_job_hash("job-abc");
        req.set_nnodes(2);
        req.set_node_rank(1);
        req.set_nproc_per_node(1);
        req.set_hostname("silent-host");
        req.set_timeout_ms(5000);
        req.set_heartbeat_timeout_ms(200);
        v1::JoinResponse resp;
        grpc::ClientContext ctx;
        prepare_context(ctx, 6s);
        return stub->Join(&ctx, req, &resp).ok();
      },
      5s));
  Started node0 = host.get();
  ASSERT_TRUE(node0.session) << node0.message;
  const Stopwatch watch;
  ASSERT_TRUE(eventually([&] { return node0.session->world_failed(); }, 3s));
  EXPECT_LT(watch.seconds(), 1.5);  // its 200 ms timeout, plus the timer's resolution
  const std::string reason = node0.session->failure_reason();
  EXPECT_TRUE(contains(reason, "node 1")) << reason;
  EXPECT_TRUE(contains(reason, "silent-host")) << reason;
  EXPECT_TRUE(contains(reason, "went silent")) << reason;
  node0.session.reset();
}

TEST(Heartbeat, ACleanLeaveIsNotAFailure) {
  auto nodes = start_world(2, 1, free_port());
  RendezvousServer* server = hosted_server(*nodes[0].session);
  ASSERT_NE(server, nullptr);
  nodes[1].session->leave("");
  ASSERT_TRUE(eventually([&] { return state_of(*server, 1) == v1::NODE_STATE_LEFT; }, 2s));
  std::this_thread::sleep_for(200ms);  // several beats later, still fine
  EXPECT_FALSE(nodes[0].session->world_failed()) << nodes[0].session->failure_reason();
  nodes[1].session->leave("");  // idempotent
  close_all(nodes);
}

TEST(Heartbeat, LeavingWithAReasonFailsTheWorldWithIt) {
  auto nodes = start_world(3, 1, free_port());
  nodes[2].session->leave("rank 2 thread failed: out of memory");
  ASSERT_TRUE(eventually([&] { return nodes[1].session->world_failed(); }, 2s));
  const std::string reason = nodes[1].session->failure_reason();
  EXPECT_TRUE(contains(reason, "node 2")) << reason;
  EXPECT_TRUE(contains(reason, "out of memory")) << reason;
  close_all(nodes);
}

TEST(Heartbeat, ARankMarkedDeadLocallyFailsTheWorld) {
  auto nodes = start_world(2, 2, free_port());
  nodes[1].session->monitor()->mark_dead(3, "rank thread failed: NaN loss");
  ASSERT_TRUE(eventually([&] { return nodes[0].session->world_failed(); }, 2s));
  EXPECT_TRUE(contains(nodes[0].session->failure_reason(), "rank 3"))
      << nodes[0].session->failure_reason();
  const auto snap = nodes[0].session->monitor()->snapshot();
  EXPECT_FALSE(snap[3].alive);
  EXPECT_EQ(snap[3].reason, "rank thread failed: NaN loss");
  close_all(nodes);
}

TEST(Heartbeat, DestroyingASessionDuringAnExceptionReportsAFailure) {
  const int port = free_port();
  auto nodes = start_world(2, 1, port);
  try {
    std::unique_ptr<NodeSession> doomed = std::move(nodes[1].session);
    throw std::runtime_error("training failed");
  } catch (const std::runtime_error&) {
  }
  ASSERT_TRUE(eventually([&] { return nodes[0].session->world_failed(); }, 2s));
  EXPECT_TRUE(contains(nodes[0].session->failure_reason(), "exited with an error"))
      << nodes[0].session->failure_reason();
  close_all(nodes);
}

TEST(Heartbeat, ALostMasterFailsTheWorldAndItsRanksAreReportedDead) {
  auto nodes = start_world(2, 2, free_port());
  RendezvousServer* server = hosted_server(*nodes[0].session);
  ASSERT_NE(server, nullptr);
  const Stopwatch watch;
  server->stop();  // the master's process is gone: every stream ends at once
  ASSERT_TRUE(eventually([&] { return nodes[1].session->world_failed(); }, 2s));
  EXPECT_LT(watch.seconds(), 1.5);
  const std::string reason = nodes[1].session->failure_reason();
  EXPECT_TRUE(contains(reason, "lost the rendezvous master at 127.0.0.1:")) << reason;
  EXPECT_TRUE(contains(reason, "ranks 0-1")) << reason;
  const auto snap = nodes[1].session->monitor()->snapshot();
  EXPECT_FALSE(snap[0].alive);
  EXPECT_EQ(snap[0].reason, "master unreachable");
  EXPECT_FALSE(snap[1].alive);
  EXPECT_TRUE(snap[2].alive);
  // Leaving with the master gone is quick and does not throw.
  const Stopwatch leave_watch;
  nodes[1].session.reset();
  EXPECT_LT(leave_watch.seconds(), 4.0);
  close_all(nodes);
}

TEST(Heartbeat, TheMasterWaitsForTheOthersToLeave) {
  auto nodes = start_world(2, 1, free_port());
  auto closing = std::async(std::launch::async, [&] { nodes[0].session.reset(); });
  std::this_thread::sleep_for(150ms);
  EXPECT_EQ(closing.wait_for(0ms), std::future_status::timeout);  // still serving node 1
  nodes[1].session->store()->set("after-master-left", {1});       // the store still works
  nodes[1].session.reset();
  EXPECT_EQ(closing.wait_for(2s), std::future_status::ready);
}

}  // namespace
}  // namespace zerod
