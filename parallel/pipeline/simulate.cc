// The event simulation of simulate.h: ranks advance in turn until each is done or blocked on a
// receive; a round in which none advances with work left is a deadlock.
#include "parallel/pipeline/simulate.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <map>
#include <utility>

#include "core/error.h"

namespace zerod::pipeline {

namespace {

struct Message {
  bool grad = false;  // a gradient (else an activation)
  int micro_batch = 0;
  int stage = 0;  // the sender's global stage
  double sent = 0.0;
};

// What has happened to one micro-batch on one global stage.
struct StageState {
  bool forward = false, activation_in = false, grad_in = false;
  bool input_grad = false;  // B or Bi ran
  bool split = false;       // it was Bi (a W must follow)
  bool weight = false;      // B, or W after Bi
  bool sent_activation = false, sent_grad = false;
};

class Simulator {
 public:
  Simulator(const Schedule& s, int micro_batches, int chunks, const Costs& costs)
      : sched_(s),
        P_(static_cast<int>(s.size())),
        M_(micro_batches),
        V_(chunks),
        S_(P_ * chunks),
        costs_(costs),
        state_(static_cast<size_t>(micro_batches) * static_cast<size_t>(P_ * chunks)),
        pc_(s.size(), 0),
        clock_(s.size(), 0.0),
        live_(s.size(), 0) {
    ZD_CHECK(P_ >= 1 && M_ >= 1 && V_ >= 1, "{} ranks, {} micro-batches, {} chunks", P_, M_, V_);
    out_.busy.assign(s.size(), 0.0);
    out_.peak_live.assign(s.size(), 0);
    for (const std::vector<Action>& list : s) out_.start.emplace_back(list.size(), 0.0);
  }

  Simulation run() {
    for (bool progress = true; progress;) {
      progress = false;
      for (int r = 0; r < P_; ++r) {
        while (pc_[r] < sched_[r].size() && step(r)) {
          ++pc_[r];
          progress = true;
        }
      }
    }
    std::string blocked;
    for (int r = 0; r < P_; ++r) {
      if (pc_[r] < sched_[r].size())
        blocked +=
            fmt::format("; rank {} waits at action {} {}", r, pc_[r], describe(sched_[r][pc_[r]]));
    }
    if (!blocked.empty())
      ZD_THROW(
          "pipeline schedule deadlocks: every unfinished rank waits for a message no rank "
          "will send{}",
          blocked);
    for (int m = 0; m < M_; ++m) {
      for (int s = 0; s < S_; ++s) {
        const StageState& st = at(m, s);
        const char* missing = !st.forward      ? "F"
                              : !st.input_grad ? "B (or Bi)"
                              : !st.weight     ? "W"
                                               : nullptr;
        if (missing != nullptr)
          ZD_THROW(
              "pipeline schedule: micro-batch {} on stage {} (rank {}, chunk {}) never gets "
              "its {}",
              m, s, stage_rank(s, P_), stage_chunk(s, P_), missing);
      }
    }
    for (const auto& [key, q] : streams_) {
      if (!q.empty())
        ZD_THROW(
            "pipeline schedule: rank {} sends {} message(s) rank {} never receives (first: "
            "the {} of micro-batch {} of stage {})",
            key.first, q.size(), key.second, q.front().grad ? "gradient" : "activation",
            q.front().micro_batch, q.front().stage);
    }
    out_.finish = clock_;
    out_.makespan = *std::max_element(clock_.begin(), clock_.end());
    double busy = 0.0;
    for (double b : out_.busy) busy += b;
    out_.bubble = out_.makespan > 0.0 ? 1.0 - busy / (P_ * out_.makespan) : 0.0;
    return out_;
  }

 private:
  const Schedule& sched_;
  int P_, M_, V_, S_;
  Costs costs_;
  std::vector<StageState> state_;  // [micro-batch][stage]
  std::vector<size_t> pc_;
  std::vector<double> clock_;
  std::vector<int> live_;
  // (sender, receiver) -> messages in flight, in the order sent
  std::map<std::pair<int, int>, std::deque<Message>> streams_;
  Simulation out_;

  StageState& at(int m, int s) {
    return state_[static_cast<size_t>(m) * static_cast<size_t>(S_) + static_cast<size_t>(s)];
  }

  template <typename... Args>
  [[noreturn]] void fail(int r, fmt::format_string<Args...> what, Args&&... args) {
    ZD_THROW("pipeline schedule: rank {}, action {} {}: {}", r, pc_[r], describe(sched_[r][pc_[r]]),
             fmt::format(what, std::forward<Args>(args)...));
  }

  void compute(int r, double cost) {
    out_.start[r][pc_[r]] = clock_[r];
    clock_[r] += cost;
    out_.busy[r] += cost;
  }
  void add_live(int r, int delta) {
    live_[r] += delta;
    out_.peak_live[r] = std::max(out_.peak_live[r], live_[r]);
  }

  void send(int r, int s, int m, int to, bool grad) {
    std::deque<Message>& q = streams_[{r, to}];
    q.push_back({grad, m, s, clock_[r]});
    out_.max_stream_depth = std::max(out_.max_stream_depth, static_cast<int>(q.size()));
    out_.start[r][pc_[r]] = clock_[r];
  }
  // false: nothing to receive yet (the rank blocks)
  bool receive(int r, int m, int from, int from_stage, bool grad) {
    auto it = streams_.find({from, r});
    if (it == streams_.end() || it->second.empty()) return false;
    const Message msg = it->second.front();
    const auto kind = [](bool g) { return g ? "gradient" : "activation"; };
    if (msg.grad != grad || msg.micro_batch != m || msg.stage != from_stage)
      fail(r,
           "the next message rank {} sent to this rank is the {} of micro-batch {} of stage {}, "
           "not the {} of micro-batch {} of stage {} (sends and receives in different orders)",
           from, kind(msg.grad), msg.micro_batch, msg.stage, kind(grad), m, from_stage);
    it->second.pop_front();
    clock_[r] = std::max(clock_[r], msg.sent);
    out_.start[r][pc_[r]] = clock_[r];
    return true;
  }

  // Runs rank r's next action; false when it is a receive with nothing to receive.
  bool step(int r) {
    const Action& a = sched_[r][pc_[r]];
    if (a.micro_batch < 0 || a.micro_batch >= M_) fail(r, "micro-batch out of 0..{}", M_ - 1);
    if (a.chunk < 0 || a.chunk >= V_) fail(r, "chunk out of 0..{}", V_ - 1);
    const int m = a.micro_batch, s = global_stage(r, a.chunk, P_);
    const bool first = s == 0, last = s == S_ - 1;
    const int prev_rank = first ? -1 : stage_rank(s - 1, P_);
    const int next_rank = last ? -1 : stage_rank(s + 1, P_);
    StageState& st = at(m, s);
    const auto expect_peer = [&](int want, const char* what) {
      if (want < 0 || want == r) fail(r, "stage {} has no {} on another rank", s, what);
      if (a.peer != want) fail(r, "the {} is rank {}, not rank {}", what, want, a.peer);
    };
    switch (a.kind) {
      case ActionKind::kForward:
        if (st.forward) fail(r, "a second forward");
        if (!first && prev_rank != r && !st.activation_in)
          fail(r, "the input activation from stage {} was not received", s - 1);
        if (!first && prev_rank == r && !at(m, s - 1).forward)
          fail(r, "runs before the forward of stage {} on this rank", s - 1);
        st.forward = true;
        compute(r, costs_.forward);
        add_live(r, 1);
        return true;
      case ActionKind::kBackward:
      case ActionKind::kBackwardInput: {
        const bool full = a.kind == ActionKind::kBackward;
        if (st.input_grad) fail(r, "a second backward");
        if (!st.forward) fail(r, "the backward before the forward of this stage");
        if (!last && next_rank != r && !st.grad_in)
          fail(r, "the output gradient from stage {} was not received", s + 1);
        if (!last && next_rank == r && !at(m, s + 1).input_grad)
          fail(r, "runs before the backward of stage {} on this rank", s + 1);
        st.input_grad = true;
        st.split = !full;
        st.weight = full;
        compute(r, full ? costs_.backward : costs_.backward_input);
        if (full) add_live(r, -1);
        return true;
      }
      case ActionKind::kBackwardWeight:
        if (!st.input_grad || !st.split) fail(r, "W without a Bi before it");
        if (st.weight) fail(r, "a second W");
        st.weight = true;
        compute(r, costs_.backward_weight);
        add_live(r, -1);
        return true;
      case ActionKind::kSendActivation:
        expect_peer(next_rank, "next stage");
        if (!st.forward) fail(r, "sends the activation before its forward");
        if (st.sent_activation) fail(r, "sends the activation twice");
        st.sent_activation = true;
        send(r, s, m, a.peer, false);
        return true;
      case ActionKind::kSendGrad:
        expect_peer(prev_rank, "previous stage");
        if (!st.input_grad) fail(r, "sends the input gradient before its backward");
        if (st.sent_grad) fail(r, "sends the input gradient twice");
        st.sent_grad = true;
        send(r, s, m, a.peer, true);
        return true;
      case ActionKind::kRecvActivation:
        expect_peer(prev_rank, "previous stage");
        if (st.activation_in) fail(r, "receives the activation twice");
        if (!receive(r, m, a.peer, s - 1, false)) return false;
        st.activation_in = true;
        return true;
      case ActionKind::kRecvGrad:
        expect_peer(next_rank, "next stage");
        if (st.grad_in) fail(r, "receives the gradient twice");
        if (!receive(r, m, a.peer, s + 1, true)) return false;
        st.grad_in = true;
        return true;
    }
    fail(r, "unknown action kind {}", static_cast<int>(a.kind));
  }
};

}  // namespace

Simulation simulate(const Schedule& schedule, int micro_batches, int virtual_stages,
                    const Costs& costs) {
  return Simulator(schedule, micro_batches, virtual_stages, costs).run();
}

}  // namespace zerod::pipeline
