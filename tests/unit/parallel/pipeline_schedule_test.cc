// Pipeline schedules as data (parallel/pipeline/schedule.h), checked by the simulator
// (simulate.h) without a model: every schedule for P in 1..8 and M in 1..32 (interleaved: V in
// 1..4, M a multiple of P) passes the dependency, send/receive-order and deadlock checks; the
// simulated bubbles equal their formulas under unit costs (F = 1, B = 2, or Bi = W = 1):
//   GPipe, 1F1B           (P-1) / (M + P-1)
//   interleaved 1F1B      (P-1) / (V M + P-1)        (each chunk's F = 1, B = 2)
//   ZB-H1                 (P-1) / (3M + P-1)         (a third of 1F1B's idle time)
// 1F1B holds at most P - r micro-batches on rank r, GPipe M, ZB-H1 at most P (as 1F1B on the
// first stage); and the checker fails on broken lists (swapped sends, a missing backward, a
// cycle of receives, a W before its Bi).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "core/error.h"
#include "parallel/pipeline/simulate.h"

namespace zerod::pipeline {
namespace {

const Costs kSplit{.forward = 1, .backward = 2, .backward_input = 1, .backward_weight = 1};

bool valid(ScheduleKind k, int P, int M, int V) {
  return schedule_problem(k, P, M, V).empty();
}

std::string message_of(const Schedule& s, int M, int V = 1) {
  try {
    simulate(s, M, V);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(PipelineSchedule, EveryScheduleIsValidForP1To8AndM1To32) {
  int checked = 0;
  for (int P = 1; P <= 8; ++P) {
    for (int M = 1; M <= 32; ++M) {
      for (ScheduleKind k :
           {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubbleH1}) {
        if (!valid(k, P, M, 1)) continue;
        SCOPED_TRACE(testing::Message() << schedule_name(k) << " P=" << P << " M=" << M);
        const Simulation sim = simulate(make_schedule(k, P, M), M, 1, kSplit);
        const double want = k == ScheduleKind::kZeroBubbleH1 && P > 1
                                ? double(P - 1) / (3.0 * M + P - 1)
                                : double(P - 1) / (M + P - 1);
        EXPECT_NEAR(sim.bubble, want, 1e-12);
        EXPECT_DOUBLE_EQ(sim.makespan, k == ScheduleKind::kZeroBubbleH1 && P > 1
                                           ? 3.0 * M + P - 1
                                           : 3.0 * (M + P - 1));
        ++checked;
      }
      for (int V = 1; V <= 4; ++V) {
        if (!valid(ScheduleKind::kInterleaved1F1B, P, M, V)) continue;
        SCOPED_TRACE(testing::Message() << "interleaved P=" << P << " M=" << M << " V=" << V);
        const Simulation sim = simulate(interleaved_1f1b_schedule(P, M, V), M, V, kSplit);
        // Each rank computes 3 V M; the idle time is 3 (P - 1), as 1F1B's with chunks of 1/V.
        EXPECT_NEAR(sim.bubble, double(P - 1) / (double(V) * M + P - 1), 1e-12);
        EXPECT_DOUBLE_EQ(sim.makespan, 3.0 * (V * M + P - 1));
        ++checked;
      }
    }
  }
  // gpipe 8 x 32, 1f1b and zb: M >= P (32 + 31 + ... + 25 = 228 each), interleaved: V = 1..4
  // times the multiples of P up to 32.
  EXPECT_EQ(checked, 256 + 228 + 228 + 4 * (32 + 16 + 10 + 8 + 6 + 5 + 4 + 4));
}

TEST(PipelineSchedule, WithOneRankEveryScheduleIsTheMicroBatchLoop) {
  for (int M : {1, 3, 8}) {
    std::vector<Action> loop;
    for (int m = 0; m < M; ++m) {
      loop.push_back({ActionKind::kForward, m, 0, -1});
      loop.push_back({ActionKind::kBackward, m, 0, -1});
    }
    for (ScheduleKind k : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB,
                           ScheduleKind::kInterleaved1F1B, ScheduleKind::kZeroBubbleH1}) {
      const Schedule s = make_schedule(k, 1, M);
      ASSERT_EQ(s.size(), 1u);
      EXPECT_EQ(s[0], loop) << schedule_name(k);
    }
    // Interleaved on one rank with V chunks: the chunks' forwards, then backwards reversed.
    const Schedule v = make_schedule(ScheduleKind::kInterleaved1F1B, 1, M, 2);
    ASSERT_EQ(v[0].size(), 4u * M);
    EXPECT_EQ(v[0][1], (Action{ActionKind::kForward, 0, 1, -1}));
    EXPECT_EQ(v[0][2], (Action{ActionKind::kBackward, 0, 1, -1}));
    EXPECT_EQ(simulate(v, M, 2).bubble, 0.0);
  }
}

TEST(PipelineSchedule, LiveActivations) {
  for (int P = 2; P <= 8; ++P) {
    for (int M = P; M <= 32; M += 3) {
      SCOPED_TRACE(testing::Message() << "P=" << P << " M=" << M);
      const Simulation gpipe = simulate(gpipe_schedule(P, M), M);
      const Simulation ofob = simulate(one_f_one_b_schedule(P, M), M);
      const Simulation zb = simulate(zero_bubble_h1_schedule(P, M), M, 1, kSplit);
      for (int r = 0; r < P; ++r) {
        EXPECT_EQ(gpipe.peak_live[r], M);
        EXPECT_EQ(ofob.peak_live[r], P - r);
        // ZB-H1 keeps r weight gradients (and their activations) back on rank r: P on every
        // rank, which is 1F1B's peak (its first stage's).
        EXPECT_EQ(zb.peak_live[r], P);
      }
      EXPECT_EQ(*std::max_element(zb.peak_live.begin(), zb.peak_live.end()),
                *std::max_element(ofob.peak_live.begin(), ofob.peak_live.end()));
      EXPECT_LT(zb.bubble, ofob.bubble);
      EXPECT_LT(zb.makespan, ofob.makespan);
    }
  }
  // Interleaved: Megatron's warm-up holds 2 (P-1) + (V-1) P + 1 chunk activations on rank 0
  // (each 1/V of the rank's layers) once M > P.
  const Simulation iv = simulate(interleaved_1f1b_schedule(4, 8, 2), 8, 2);
  EXPECT_EQ(iv.peak_live[0], 2 * 3 + 4 + 1);
}

TEST(PipelineSchedule, RefusesWhatTheScheduleCannotRun) {
  EXPECT_NE(schedule_problem(ScheduleKind::kOneFOneB, 4, 3, 1).find("3 micro-batches"),
            std::string::npos);
  EXPECT_NE(schedule_problem(ScheduleKind::kZeroBubbleH1, 4, 2, 1), "");
  EXPECT_EQ(schedule_problem(ScheduleKind::kGPipe, 4, 2, 1), "");
  EXPECT_NE(schedule_problem(ScheduleKind::kInterleaved1F1B, 4, 6, 2).find("not a multiple of 4"),
            std::string::npos);
  EXPECT_NE(schedule_problem(ScheduleKind::kOneFOneB, 2, 4, 2).find("interleaved_1f1b"),
            std::string::npos);
  EXPECT_THROW(make_schedule(ScheduleKind::kOneFOneB, 4, 3), InputError);
  ScheduleKind k{};
  EXPECT_TRUE(parse_schedule_name("zero_bubble", k));
  EXPECT_EQ(k, ScheduleKind::kZeroBubbleH1);
  EXPECT_FALSE(parse_schedule_name("zb", k));
}

// The checker itself fails on broken lists.
TEST(PipelineSchedule, CheckerCatchesSwappedSends) {
  // GPipe's rank 0 runs F(0) send(0) F(1) send(1) ...; send(1) before send(0) (both after their
  // forwards): rank 1 receives micro-batch 1 when it expects 0.
  Schedule s = gpipe_schedule(2, 4);
  ASSERT_EQ(s[0][1], (Action{ActionKind::kSendActivation, 0, 0, 1}));
  ASSERT_EQ(s[0][3], (Action{ActionKind::kSendActivation, 1, 0, 1}));
  std::rotate(s[0].begin() + 1, s[0].begin() + 2, s[0].begin() + 4);  // F0 F1 send1 send0
  ASSERT_EQ(s[0][3], (Action{ActionKind::kSendActivation, 0, 0, 1}));
  std::string msg = message_of(s, 4);
  EXPECT_NE(msg.find("rank 1, action 0 recv_act(mb 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("different orders"), std::string::npos) << msg;
  // A send moved before its forward.
  Schedule t = one_f_one_b_schedule(2, 4);
  std::swap(t[0][0], t[0][1]);  // send(0) F(0)
  msg = message_of(t, 4);
  EXPECT_NE(msg.find("before its forward"), std::string::npos) << msg;
}

// Activations and gradients share one ordered stream per pair of ranks (as comm's point-to-point
// messages match by order per ordered pair): at P = 2 with V = 2, rank 0 sends rank 1 both, and
// rank 1 must receive them in the order they were sent.
TEST(PipelineSchedule, CheckerOrdersActivationsAndGradientsOnOneStream) {
  Schedule s = interleaved_1f1b_schedule(2, 2, 2);
  std::vector<Action>& r1 = s[1];
  const auto is = [](ActionKind k) { return [k](const Action& a) { return a.kind == k; }; };
  const auto grad = std::find_if(r1.begin(), r1.end(), is(ActionKind::kRecvGrad));
  ASSERT_NE(grad, r1.end());
  ASSERT_EQ(grad->peer, 0);
  const auto act =
      std::find_if(std::make_reverse_iterator(grad), r1.rend(), is(ActionKind::kRecvActivation));
  ASSERT_NE(act, r1.rend());
  // The gradient's receive moved before the activation's that precedes it.
  const Action g = *grad;
  const auto at = std::prev(act.base());
  r1.erase(grad);
  r1.insert(at, g);
  const std::string msg = message_of(s, 2, 2);
  EXPECT_NE(msg.find("the next message rank 0 sent to this rank is the activation"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("not the gradient"), std::string::npos) << msg;
}

TEST(PipelineSchedule, CheckerCatchesAMissingBackward) {
  Schedule s = one_f_one_b_schedule(3, 6);
  auto it = std::find(s[2].begin(), s[2].end(), Action{ActionKind::kBackward, 5, 0, -1});
  ASSERT_NE(it, s[2].end());
  s[2].erase(it);
  // Rank 2 still sends micro-batch 5's gradient: caught at the send.
  EXPECT_NE(message_of(s, 6).find("before its backward"), std::string::npos);
  // Without the send either, rank 1 waits for it forever.
  s[2].erase(std::find(s[2].begin(), s[2].end(), Action{ActionKind::kSendGrad, 5, 0, 1}));
  const std::string msg = message_of(s, 6);
  EXPECT_NE(msg.find("deadlocks"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 1 waits"), std::string::npos) << msg;
  // A last stage's missing B with nothing downstream of it: the completeness check.
  Schedule one = gpipe_schedule(1, 2);
  one[0].pop_back();
  EXPECT_NE(message_of(one, 2).find("never gets its B"), std::string::npos);
}

TEST(PipelineSchedule, CheckerCatchesACycle) {
  // Rank 0 waits for micro-batch 0's gradient before sending its activation: rank 1 waits for
  // the activation, rank 0 for the gradient.
  Schedule s(2);
  s[0] = {{ActionKind::kForward, 0, 0, -1},
          {ActionKind::kRecvGrad, 0, 0, 1},
          {ActionKind::kSendActivation, 0, 0, 1},
          {ActionKind::kBackward, 0, 0, -1}};
  s[1] = {{ActionKind::kRecvActivation, 0, 0, 0},
          {ActionKind::kForward, 0, 0, -1},
          {ActionKind::kBackward, 0, 0, -1},
          {ActionKind::kSendGrad, 0, 0, 0}};
  const std::string msg = message_of(s, 1);
  EXPECT_NE(msg.find("deadlocks"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 0 waits at action 1 recv_grad"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 1 waits at action 0 recv_act"), std::string::npos) << msg;
  // The same lists in the right order pass.
  std::swap(s[0][1], s[0][2]);
  EXPECT_EQ(message_of(s, 1), "");
}

TEST(PipelineSchedule, CheckerCatchesWrongPeersAndSplitBackwards) {
  Schedule s = zero_bubble_h1_schedule(3, 3);
  Schedule w = s;
  // A W moved before its Bi.
  auto wi = std::find(w[1].begin(), w[1].end(), Action{ActionKind::kBackwardWeight, 0, 0, -1});
  ASSERT_NE(wi, w[1].end());
  const Action moved = *wi;
  w[1].erase(wi);
  w[1].insert(w[1].begin(), moved);
  EXPECT_NE(message_of(w, 3).find("W without a Bi"), std::string::npos);
  // A dropped W.
  Schedule d = s;
  d[0].erase(std::find(d[0].begin(), d[0].end(), Action{ActionKind::kBackwardWeight, 2, 0, -1}));
  EXPECT_NE(message_of(d, 3).find("never gets its W"), std::string::npos) << message_of(d, 3);
  // A send to the wrong rank.
  Schedule p = gpipe_schedule(3, 2);
  for (Action& a : p[0])
    if (a.kind == ActionKind::kSendActivation) a.peer = 2;
  EXPECT_NE(message_of(p, 2).find("the next stage is rank 1, not rank 2"), std::string::npos);
  // A message never received.
  Schedule x = gpipe_schedule(2, 1);
  x[1].erase(x[1].begin());  // rank 1's recv_act of micro-batch 0
  EXPECT_NE(message_of(x, 1).find("not received"), std::string::npos);
}

}  // namespace
}  // namespace zerod::pipeline
