// The four schedules' action lists (the orders of Megatron-LM's schedules.py, torch's
// torch.distributed.pipelining and the zero-bubble paper, written for zerod's action type).
#include "parallel/pipeline/schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <map>

#include "core/error.h"

namespace zerod::pipeline {

const char* action_kind_name(ActionKind k) {
  switch (k) {
    case ActionKind::kForward:
      return "F";
    case ActionKind::kBackward:
      return "B";
    case ActionKind::kBackwardInput:
      return "Bi";
    case ActionKind::kBackwardWeight:
      return "W";
    case ActionKind::kSendActivation:
      return "send_act";
    case ActionKind::kRecvActivation:
      return "recv_act";
    case ActionKind::kSendGrad:
      return "send_grad";
    case ActionKind::kRecvGrad:
      return "recv_grad";
  }
  return "?";
}

bool is_compute(ActionKind k) {
  return k == ActionKind::kForward || k == ActionKind::kBackward ||
         k == ActionKind::kBackwardInput || k == ActionKind::kBackwardWeight;
}

std::string describe(const Action& a) {
  if (is_compute(a.kind))
    return fmt::format("{}(mb {}, chunk {})", action_kind_name(a.kind), a.micro_batch, a.chunk);
  const bool send = a.kind == ActionKind::kSendActivation || a.kind == ActionKind::kSendGrad;
  return fmt::format("{}(mb {}, chunk {} {} rank {})", action_kind_name(a.kind), a.micro_batch,
                     a.chunk, send ? "->" : "<-", a.peer);
}

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> names = {"gpipe", "1f1b", "interleaved_1f1b",
                                                 "zero_bubble"};
  return names;
}

const char* schedule_name(ScheduleKind k) {
  return schedule_names().at(static_cast<size_t>(k)).c_str();
}

bool parse_schedule_name(const std::string& name, ScheduleKind& out) {
  const std::vector<std::string>& names = schedule_names();
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) {
      out = static_cast<ScheduleKind>(i);
      return true;
    }
  }
  return false;
}

std::string schedule_problem(ScheduleKind k, int ranks, int micro_batches, int virtual_stages) {
  const int P = ranks, M = micro_batches, V = virtual_stages;
  if (P < 1 || M < 1 || V < 1)
    return fmt::format("{} pipeline ranks, {} micro-batches, {} virtual stages: each must be >= 1",
                       P, M, V);
  if (V > 1 && k != ScheduleKind::kInterleaved1F1B)
    return fmt::format(
        "{} virtual stages per rank need the \"interleaved_1f1b\" schedule, not \"{}\"", V,
        schedule_name(k));
  if ((k == ScheduleKind::kOneFOneB || k == ScheduleKind::kZeroBubbleH1) && M < P)
    return fmt::format(
        "\"{}\" needs at least as many micro-batches as pipeline stages: {} micro-batches "
        "(gradient_accumulation_steps) < {} stages",
        schedule_name(k), M, P);
  if (k == ScheduleKind::kInterleaved1F1B && M % P != 0)
    return fmt::format(
        "\"interleaved_1f1b\" needs the micro-batches to be a multiple of the pipeline stages: "
        "{} micro-batches (gradient_accumulation_steps) is not a multiple of {}",
        M, P);
  return "";
}

namespace {

// Appends one rank's actions with the sends and receives around each compute action.
class RankList {
 public:
  RankList(int rank, int ranks, int chunks) : r_(rank), P_(ranks), S_(ranks * chunks) {}

  void forward(int mb, int chunk) {
    const int s = global_stage(r_, chunk, P_);
    if (s > 0 && stage_rank(s - 1, P_) != r_)
      out_.push_back({ActionKind::kRecvActivation, mb, chunk, stage_rank(s - 1, P_)});
    out_.push_back({ActionKind::kForward, mb, chunk, -1});
    if (s + 1 < S_ && stage_rank(s + 1, P_) != r_)
      out_.push_back({ActionKind::kSendActivation, mb, chunk, stage_rank(s + 1, P_)});
  }
  // kind: kBackward or kBackwardInput (the gradient that goes upstream either way)
  void backward(int mb, int chunk, ActionKind kind) {
    const int s = global_stage(r_, chunk, P_);
    if (s + 1 < S_ && stage_rank(s + 1, P_) != r_)
      out_.push_back({ActionKind::kRecvGrad, mb, chunk, stage_rank(s + 1, P_)});
    out_.push_back({kind, mb, chunk, -1});
    if (s > 0 && stage_rank(s - 1, P_) != r_)
      out_.push_back({ActionKind::kSendGrad, mb, chunk, stage_rank(s - 1, P_)});
  }
  void weight(int mb, int chunk) { out_.push_back({ActionKind::kBackwardWeight, mb, chunk, -1}); }

  std::vector<Action> take() { return std::move(out_); }

 private:
  int r_, P_, S_;
  std::vector<Action> out_;
};

// The 1F1B shape of every non-GPipe schedule: `warmup` forwards, then one forward and one
// backward alternately until the `total` forwards ran, then the remaining backwards. forward(k)
// and backward(k) emit the rank's k-th of each.
void one_forward_one_backward(int warmup, int total, const std::function<void(int)>& forward,
                              const std::function<void(int)>& backward) {
  int f = 0, b = 0;
  while (f < warmup) forward(f++);
  while (f < total) {
    forward(f++);
    backward(b++);
  }
  while (b < total) backward(b++);
}

// One RankList per rank, filled by fill(rank, list).
Schedule per_rank(int ranks, int chunks, const std::function<void(int, RankList&)>& fill) {
  Schedule out;
  for (int r = 0; r < ranks; ++r) {
    RankList l(r, ranks, chunks);
    fill(r, l);
    out.push_back(l.take());
  }
  return out;
}

// P = 1: per micro-batch the chunks' forwards, then their full backwards in reverse.
Schedule single_rank_loop(int micro_batches, int chunks) {
  return per_rank(1, chunks, [&](int, RankList& l) {
    for (int m = 0; m < micro_batches; ++m) {
      for (int c = 0; c < chunks; ++c) l.forward(m, c);
      for (int c = chunks - 1; c >= 0; --c) l.backward(m, c, ActionKind::kBackward);
    }
  });
}

void require(ScheduleKind k, int P, int M, int V) {
  const std::string why = schedule_problem(k, P, M, V);
  if (!why.empty()) ZD_THROW_INPUT("pipeline schedule \"{}\": {}", schedule_name(k), why);
}

}  // namespace

Schedule gpipe_schedule(int ranks, int micro_batches) {
  require(ScheduleKind::kGPipe, ranks, micro_batches, 1);
  if (ranks == 1) return single_rank_loop(micro_batches, 1);
  return per_rank(ranks, 1, [&](int, RankList& l) {
    for (int m = 0; m < micro_batches; ++m) l.forward(m, 0);
    for (int m = 0; m < micro_batches; ++m) l.backward(m, 0, ActionKind::kBackward);
  });
}

Schedule one_f_one_b_schedule(int ranks, int micro_batches) {
  require(ScheduleKind::kOneFOneB, ranks, micro_batches, 1);
  if (ranks == 1) return single_rank_loop(micro_batches, 1);
  return per_rank(ranks, 1, [&](int r, RankList& l) {
    one_forward_one_backward(
        std::min(ranks - 1 - r, micro_batches), micro_batches, [&](int m) { l.forward(m, 0); },
        [&](int m) { l.backward(m, 0, ActionKind::kBackward); });
  });
}

Schedule interleaved_1f1b_schedule(int ranks, int micro_batches, int virtual_stages) {
  require(ScheduleKind::kInterleaved1F1B, ranks, micro_batches, virtual_stages);
  const int P = ranks, M = micro_batches, V = virtual_stages;
  if (P == 1) return single_rank_loop(M, V);
  if (V == 1) return one_f_one_b_schedule(P, M);
  // The k-th forward (backward) of a rank: micro-batch group k / (P x V) of P micro-batches,
  // chunk (k / P) mod V (backwards: reversed), micro-batch k mod P inside the group.
  const auto micro_batch_of = [&](int k) { return k / (P * V) * P + k % P; };
  const auto forward_chunk = [&](int k) { return k / P % V; };
  const auto backward_chunk = [&](int k) { return V - 1 - k / P % V; };
  const int total = M * V;
  return per_rank(P, V, [&](int r, RankList& l) {
    one_forward_one_backward(
        std::min((P - 1 - r) * 2 + (V - 1) * P, total), total,
        [&](int k) { l.forward(micro_batch_of(k), forward_chunk(k)); },
        [&](int k) { l.backward(micro_batch_of(k), backward_chunk(k), ActionKind::kBackward); });
  });
}

Schedule zero_bubble_h1_schedule(int ranks, int micro_batches) {
  require(ScheduleKind::kZeroBubbleH1, ranks, micro_batches, 1);
  if (ranks == 1) return single_rank_loop(micro_batches, 1);
  return per_rank(ranks, 1, [&](int r, RankList& l) {
    std::deque<int> pending_w;  // micro-batches whose Bi ran and W not yet, oldest first
    const auto backward = [&](int m) {
      l.backward(m, 0, ActionKind::kBackwardInput);
      pending_w.push_back(m);
      // Rank r keeps r weight gradients back: they fill the waits of its cool-down.
      if (static_cast<int>(pending_w.size()) > r) {
        l.weight(pending_w.front(), 0);
        pending_w.pop_front();
      }
    };
    one_forward_one_backward(
        std::min(ranks - 1 - r, micro_batches), micro_batches, [&](int m) { l.forward(m, 0); },
        backward);
    for (int m : pending_w) l.weight(m, 0);
  });
}

Schedule make_schedule(ScheduleKind k, int ranks, int micro_batches, int virtual_stages) {
  require(k, ranks, micro_batches, virtual_stages);
  switch (k) {
    case ScheduleKind::kGPipe:
      return gpipe_schedule(ranks, micro_batches);
    case ScheduleKind::kOneFOneB:
      return one_f_one_b_schedule(ranks, micro_batches);
    case ScheduleKind::kInterleaved1F1B:
      return interleaved_1f1b_schedule(ranks, micro_batches, virtual_stages);
    case ScheduleKind::kZeroBubbleH1:
      return zero_bubble_h1_schedule(ranks, micro_batches);
  }
  ZD_THROW("unknown schedule kind {}", static_cast<int>(k));
}

int slots_needed(const std::vector<Action>& actions, int chunk) {
  std::map<int, int> live;  // per chunk
  int most = 0;
  for (const Action& a : actions) {
    if (chunk >= 0 && a.chunk != chunk) continue;
    if (a.kind == ActionKind::kForward) most = std::max(most, ++live[a.chunk]);
    if (a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardWeight) --live[a.chunk];
  }
  return std::max(most, 1);
}

int weight_passes_pending(const std::vector<Action>& actions) {
  int pending = 0, most = 0;
  for (const Action& a : actions) {
    if (a.kind == ActionKind::kBackwardInput) most = std::max(most, ++pending);
    if (a.kind == ActionKind::kBackwardWeight) --pending;
  }
  return most;
}

}  // namespace zerod::pipeline
