// The elastic membership logic (engine/runtime/elastic_registry.h) on a clock of the test's own:
// the first round waits the settle time, a silent member closes its round and the survivors
// form the next at once, a joiner is admitted through a stop-and-rejoin, bad joiners (duplicate
// node rank, another job, an old epoch) are refused, and the restart budget and MIN bound it.
#include "engine/runtime/elastic_registry.h"

#include <gtest/gtest.h>

namespace zerod {
namespace {

using namespace std::chrono_literals;

ElasticConfig config(int min_nodes, int max_nodes, std::vector<int> admissible) {
  ElasticConfig c;
  c.job_hash = "h";
  c.min_nodes = min_nodes;
  c.max_nodes = max_nodes;
  c.admissible = std::move(admissible);
  c.settle = 1000ms;
  c.heartbeat_timeout = 2000ms;
  c.below_min_timeout = 5000ms;
  c.max_restarts = 2;
  return c;
}

ElasticJoin joiner(int rank, int64_t epoch = 0, std::string instance = "") {
  ElasticJoin j;
  j.job_hash = "h";
  j.node_rank = rank;
  j.min_nodes = 2;
  j.max_nodes = 3;
  j.address = "127.0.0.1";
  j.port = 40000 + rank;
  j.epoch = epoch;
  j.instance = instance.empty() ? "i" + std::to_string(rank) : instance;
  return j;
}

AgentReply beat(ElasticRegistry& r, int rank, int64_t epoch, WorkerEventKind e,
                Clock::time_point t) {
  return r.beat(rank, "i" + std::to_string(rank), epoch, e, "", t);
}

TEST(ElasticRegistry, FirstRoundWaitsTheSettleTimeThenTakesEveryNode) {
  ElasticRegistry reg(config(2, 3, {2, 3}));
  const auto t0 = Clock::now();
  EXPECT_FALSE(reg.join(joiner(0), t0).formed);
  EXPECT_FALSE(reg.join(joiner(1), t0).formed);  // MIN reached: the settle time starts
  reg.tick(t0 + 500ms);
  EXPECT_EQ(reg.view(t0).epoch, 0);
  const ElasticRound r = reg.join(joiner(1), t0 + 1001ms);
  ASSERT_TRUE(r.formed) << r.reason;
  EXPECT_EQ(r.epoch, 1);
  EXPECT_EQ(r.members, (std::vector<int>{0, 1}));
  EXPECT_EQ(r.round_rank, 1);
  EXPECT_EQ(r.master, "127.0.0.1:40000");  // node 0's address hosts the workers' rendezvous
}

TEST(ElasticRegistry, MaxNodesFormAtOnce) {
  ElasticRegistry reg(config(2, 3, {2, 3}));
  const auto t0 = Clock::now();
  reg.join(joiner(0), t0);
  reg.join(joiner(1), t0);
  EXPECT_TRUE(reg.join(joiner(2), t0).formed);
}

TEST(ElasticRegistry, ASilentMemberRestartsTheRoundAndTheSurvivorsFormTheNextAtOnce) {
  ElasticRegistry reg(config(2, 3, {2, 3}));
  auto t = Clock::now();
  for (int i = 0; i < 3; ++i) reg.join(joiner(i), t);
  ASSERT_EQ(reg.view(t).epoch, 1);
  t += 1500ms;
  EXPECT_EQ(beat(reg, 0, 1, WorkerEventKind::kRunning, t).action, AgentAction::kContinue);
  // Node 2's worker died with it; node 1's worker saw the lost peer and failed.
  EXPECT_EQ(beat(reg, 1, 1, WorkerEventKind::kFailed, t).action, AgentAction::kRestart);
  EXPECT_EQ(beat(reg, 0, 1, WorkerEventKind::kRunning, t).action, AgentAction::kRestart);
  EXPECT_EQ(reg.view(t).restarts_used, 1);
  EXPECT_FALSE(reg.join(joiner(0, 1), t).formed);
  EXPECT_FALSE(reg.join(joiner(1, 1), t).formed);  // node 2 is not known to be dead yet
  t += 600ms;                                      // node 2 silent for 2.1 s
  beat(reg, 0, 1, WorkerEventKind::kFailed, t);
  beat(reg, 1, 1, WorkerEventKind::kFailed, t);
  reg.tick(t);
  const ElasticRound r = reg.join(joiner(0, 1), t);
  ASSERT_TRUE(r.formed) << r.reason;
  EXPECT_EQ(r.epoch, 2);
  EXPECT_EQ(r.members, (std::vector<int>{0, 1}));
  const ElasticView v = reg.view(t);
  EXPECT_NE(v.last_change.find("node 2 left: no heartbeat"), std::string::npos) << v.last_change;
  EXPECT_NEAR(v.last_recovery_seconds, 0.6, 1e-9);  // from the failure report to the new round
  // The dropped node's beats are answered with exit; coming back with its old epoch is refused.
  EXPECT_EQ(beat(reg, 2, 1, WorkerEventKind::kRunning, t).action, AgentAction::kExit);
  try {
    reg.join(joiner(2, 1), t);
    FAIL() << "an agent of epoch 1 joined epoch 2";
  } catch (const ElasticRefusal& e) {
    EXPECT_NE(std::string(e.what()).find("epoch 1, but the job is at epoch 2"), std::string::npos)
        << e.what();
  }
}

TEST(ElasticRegistry, AJoinerIsAdmittedThroughAStopWithASaveAndARejoin) {
  ElasticRegistry reg(config(2, 3, {2, 3}));
  auto t = Clock::now();
  reg.join(joiner(0), t);
  reg.join(joiner(1), t);
  t += 1001ms;
  reg.tick(t);
  ASSERT_EQ(reg.view(t).members, (std::vector<int>{0, 1}));
  EXPECT_FALSE(reg.join(joiner(2), t).formed);
  EXPECT_EQ(beat(reg, 0, 1, WorkerEventKind::kRunning, t).action, AgentAction::kRejoin);
  EXPECT_EQ(beat(reg, 1, 1, WorkerEventKind::kStopped, t).action, AgentAction::kRejoin);
  reg.join(joiner(1, 1), t);
  const ElasticRound r = reg.join(joiner(0, 1), t);
  ASSERT_TRUE(r.formed) << r.reason;
  EXPECT_EQ(r.members, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(reg.view(t).restarts_used, 0);  // a join is no failure
}

TEST(ElasticRegistry, AJoinerThatDiesDuringTheReshardDoesNotWedgeTheOthers) {
  ElasticRegistry reg(config(2, 3, {2, 3}));
  auto t = Clock::now();
  reg.join(joiner(0), t);
  reg.join(joiner(1), t);
  t += 1001ms;
  reg.tick(t);
  reg.join(joiner(2), t);  // the members stop with a save and rejoin; the joiner dies meanwhile
  reg.join(joiner(0, 1), t + 500ms);
  ASSERT_TRUE(reg.join(joiner(1, 1), t + 500ms).formed);
  EXPECT_EQ(reg.view(t).members, (std::vector<int>{0, 1, 2}));  // its worker never comes
  beat(reg, 0, 2, WorkerEventKind::kRunning, t + 1500ms);
  beat(reg, 1, 2, WorkerEventKind::kRunning, t + 1500ms);
  reg.tick(t + 2001ms);  // silent for the heartbeat timeout: dropped, the round restarts
  EXPECT_EQ(beat(reg, 0, 2, WorkerEventKind::kRunning, t + 2001ms).action, AgentAction::kRestart);
  reg.join(joiner(1, 2), t + 2001ms);
  const ElasticRound r = reg.join(joiner(0, 2), t + 2001ms);
  ASSERT_TRUE(r.formed) << r.reason;
  EXPECT_EQ(r.members, (std::vector<int>{0, 1}));
  EXPECT_EQ(r.epoch, 3);
}

TEST(ElasticRegistry, OnlyAdmissibleNodeCountsFormRounds) {
  ElasticRegistry reg(config(2, 4, {2, 4}));  // 3 nodes cannot keep the global batch
  auto t = Clock::now();
  for (int i = 0; i < 3; ++i) {
    ElasticJoin j = joiner(i);
    j.max_nodes = 4;
    reg.join(j, t);
  }
  reg.tick(t + 2s);
  const ElasticView v = reg.view(t + 2s);
  EXPECT_EQ(v.members, (std::vector<int>{0, 1}));
  EXPECT_EQ(v.waiting, (std::vector<int>{2}));  // standby
}

TEST(ElasticRegistry, BadJoinersAreRefused) {
  ElasticRegistry reg(config(2, 3, {2, 3}));
  const auto t = Clock::now();
  reg.join(joiner(0), t);
  auto refused = [&](ElasticJoin j, const std::string& want) {
    try {
      reg.join(j, t);
      ADD_FAILURE() << "joined: " << want;
    } catch (const ElasticRefusal& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  refused(joiner(0, 0, "other"), "node rank 0 is taken");
  ElasticJoin other_job = joiner(1);
  other_job.job_hash = "x";
  refused(other_job, "different job (config hash x, the job's is h)");
  ElasticJoin other_size = joiner(1);
  other_size.max_nodes = 4;
  refused(other_size, "--nnodes 2:4, the job 2:3");
  refused(joiner(1, 7), "epoch 7, but the job is at epoch 0");
  EXPECT_EQ(reg.view(t).waiting, (std::vector<int>{0}));  // nothing refused was registered
}

TEST(ElasticRegistry, TheRestartBudgetAndMinEndTheJob) {
  ElasticRegistry reg(config(2, 3, {2, 3}));
  auto t = Clock::now();
  for (int i = 0; i < 3; ++i) reg.join(joiner(i), t);
  for (int round = 1; round <= 3; ++round) {
    beat(reg, 0, round, WorkerEventKind::kFailed, t);
    if (round == 3) break;
    for (int i = 0; i < 3; ++i) reg.join(joiner(i, round), t);
    ASSERT_EQ(reg.view(t).epoch, round + 1);
  }
  const AgentReply r = beat(reg, 1, 3, WorkerEventKind::kRunning, t);
  EXPECT_EQ(r.action, AgentAction::kExit);
  EXPECT_TRUE(r.failed);
  EXPECT_NE(r.reason.find("--max-restarts 2 used up"), std::string::npos) << r.reason;

  ElasticRegistry small(config(2, 3, {2, 3}));
  t = Clock::now();
  small.join(joiner(0), t);
  small.join(joiner(1), t);
  t += 1001ms;
  small.tick(t);
  beat(small, 1, 1, WorkerEventKind::kRunning, t);
  small.join(joiner(0, 1), t + 2001ms);  // node 0's worker failed; node 1 went silent
  small.tick(t + 2001ms);
  EXPECT_EQ(small.view(t).phase, "gathering");
  small.beat(0, "i0", 1, WorkerEventKind::kFailed, "", t + 7002ms);
  small.tick(t + 7002ms);
  const ElasticView v = small.view(t);
  EXPECT_EQ(v.phase, "failed");
  EXPECT_NE(v.failure.find("below the smallest node count it can train at (2 of --nnodes 2:3)"),
            std::string::npos)
      << v.failure;
}

TEST(ElasticRegistry, AStopRequestStopsEveryMemberThenExits) {
  ElasticRegistry reg(config(2, 3, {2, 3}));
  auto t = Clock::now();
  for (int i = 0; i < 3; ++i) reg.join(joiner(i), t);
  beat(reg, 1, 1, WorkerEventKind::kStopRequested, t);
  EXPECT_EQ(beat(reg, 0, 1, WorkerEventKind::kRunning, t).action, AgentAction::kStop);
  beat(reg, 0, 1, WorkerEventKind::kStopped, t);
  beat(reg, 1, 1, WorkerEventKind::kStopped, t);
  EXPECT_EQ(beat(reg, 2, 1, WorkerEventKind::kStopped, t).action, AgentAction::kExit);
  EXPECT_EQ(reg.view(t).phase, "stopped");
}

}  // namespace
}  // namespace zerod

namespace zerod {
namespace {

// Node 0's agent hosts (instance i0): its successors are the other live agents by node rank.
TEST(ElasticRegistry, TheSuccessorsAreTheLiveAgentsButTheHostInNodeRankOrder) {
  ElasticConfig c = config(2, 3, {2, 3});
  c.host_instance = "i0";
  ElasticRegistry reg(c);
  auto t = Clock::now();
  for (int i : {2, 0, 1}) reg.join(joiner(i), t);
  auto ranks = [](const std::vector<ElasticPeer>& ps) {
    std::vector<int> out;
    for (const auto& p : ps) out.push_back(p.node_rank);
    return out;
  };
  const AgentReply r = beat(reg, 2, 1, WorkerEventKind::kRunning, t);
  EXPECT_EQ(ranks(r.peers), (std::vector<int>{1, 2}));
  EXPECT_EQ(r.peers[0].instance, "i1");
  EXPECT_EQ(r.peers[0].address, "127.0.0.1");
  beat(reg, 0, 1, WorkerEventKind::kRunning, t + 1500ms);
  beat(reg, 2, 1, WorkerEventKind::kRunning, t + 1500ms);
  reg.tick(t + 2001ms);  // node 1 silent: no longer a successor
  EXPECT_EQ(ranks(beat(reg, 2, 1, WorkerEventKind::kRunning, t + 2001ms).peers),
            (std::vector<int>{2}));
}

ElasticTakeover takeover_of_node0(int64_t epoch, int restarts) {
  ElasticTakeover t;
  t.epoch = epoch;
  t.restarts_used = restarts;
  t.steps_lost_total = 4;
  t.agents = {{1, "i1", "h1", "127.0.0.1"}, {2, "i2", "h2", "127.0.0.1"}};
  t.lost_rank = 0;
  t.lost_instance = "i0";
  t.why = "the rendezvous host stopped answering";
  t.silent_seconds = 2.5;
  return t;
}

// Node 1 takes the rendezvous over from node 0 (lost at epoch 3, one restart used before): the
// new registry gathers the survivors as after any failure, counts the restart, forms epoch 4
// with nodes 1 and 2 once both rejoined, refuses the lost host's agent and admits a new node 0.
TEST(ElasticRegistry, ATakeoverGathersTheSurvivorsCountsTheRestartAndRefusesTheLostHost) {
  ElasticConfig c = config(2, 3, {2, 3});
  c.host_instance = "i1";
  ElasticRegistry reg(c, takeover_of_node0(3, 1));
  auto t = Clock::now();
  ElasticView v = reg.view(t);
  EXPECT_EQ(v.phase, "gathering");
  EXPECT_EQ(v.epoch, 3);
  EXPECT_EQ(v.restarts_used, 2);
  EXPECT_EQ(v.steps_lost_total, 4);
  EXPECT_NE(v.last_change.find("node 0 left: the rendezvous host stopped answering"),
            std::string::npos)
      << v.last_change;
  EXPECT_FALSE(reg.join(joiner(1, 3), t).formed);  // node 2 is expected back
  const ElasticRound r = reg.join(joiner(2, 3), t);
  ASSERT_TRUE(r.formed) << r.reason;
  EXPECT_GE(r.last_recovery_seconds, 2.5);  // from the host's last renewal of its lease
  EXPECT_EQ(r.epoch, 4);
  EXPECT_EQ(r.members, (std::vector<int>{1, 2}));
  EXPECT_EQ(r.master, "127.0.0.1:40001");  // the round's workers meet at node 1's
  EXPECT_EQ(r.restarts_used, 2);
  ASSERT_EQ(r.peers.size(), 1u);  // node 1 hosts now: node 2 would take over from it
  EXPECT_EQ(r.peers[0].node_rank, 2);
  try {
    reg.join(joiner(0, 3, "i0"), t);  // the lost host's agent, back from a pause
    ADD_FAILURE() << "the lost host rejoined";
  } catch (const ElasticRefusal& e) {
    EXPECT_NE(std::string(e.what()).find("was dropped from the job"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(reg.join(joiner(0, 0, "new0"), t).formed);  // a new node 0: the next boundary
  EXPECT_EQ(reg.beat(1, "i1", 4, WorkerEventKind::kRunning, "", t).action, AgentAction::kRejoin);
}

TEST(ElasticRegistry, ATakeoverThatExceedsTheRestartBudgetFailsTheJob) {
  ElasticRegistry reg(config(2, 3, {2, 3}), takeover_of_node0(5, 2));  // --max-restarts 2
  const ElasticView v = reg.view(Clock::now());
  EXPECT_EQ(v.phase, "failed");
  EXPECT_NE(v.failure.find("--max-restarts 2 used up (3 failures)"), std::string::npos)
      << v.failure;
}

// A worker's restore reports the steps its failure lost, once per round; they add up.
TEST(ElasticRegistry, TheStepsLostPerFailureAddUpOncePerRound) {
  ElasticRegistry reg(config(2, 3, {2, 3}));
  auto t = Clock::now();
  for (int i = 0; i < 3; ++i) reg.join(joiner(i), t);
  EXPECT_EQ(reg.view(t).steps_lost, -1);
  beat(reg, 2, 1, WorkerEventKind::kFailed, t);
  for (int i = 0; i < 3; ++i) reg.join(joiner(i, 1), t);
  reg.beat(0, "i0", 2, WorkerEventKind::kRunning, "restored step 12; 3 step(s) lost", t, 3);
  reg.beat(1, "i1", 2, WorkerEventKind::kRunning, "restored step 12; 3 step(s) lost", t, 3);
  EXPECT_EQ(reg.view(t).steps_lost, 3);
  EXPECT_EQ(reg.view(t).steps_lost_total, 3);
  beat(reg, 1, 2, WorkerEventKind::kFailed, t);
  for (int i = 0; i < 3; ++i) reg.join(joiner(i, 2), t);
  const ElasticRound r = reg.join(joiner(0, 2), t);
  EXPECT_EQ(r.steps_lost_total, 3);
  reg.beat(0, "i0", 3, WorkerEventKind::kRunning, "restored step 20; 0 step(s) lost", t, 0);
  EXPECT_EQ(reg.view(t).steps_lost, 0);
  EXPECT_EQ(reg.view(t).steps_lost_total, 3);
  EXPECT_NE(reg.view(t).last_change.find("restored step 20"), std::string::npos);
}

}  // namespace
}  // namespace zerod
