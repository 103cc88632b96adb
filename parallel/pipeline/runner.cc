#include "parallel/pipeline/runner.h"

#include <algorithm>
#include <chrono>
#include <map>

#include "core/error.h"
#include "zero/compute_comm.h"

namespace zerod::pipeline {

int slots_needed(const std::vector<Action>& actions) {
  std::map<int, int> live;  // per chunk
  int most = 0;
  for (const Action& a : actions) {
    if (a.kind == ActionKind::kForward) most = std::max(most, ++live[a.chunk]);
    if (a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardWeight) --live[a.chunk];
  }
  return std::max(most, 1);
}

PipelineRunner::PipelineRunner(std::vector<Action> actions, Model& model, Backend& backend,
                               Communicator* comm, MemoryTracker* tracker)
    : actions_(std::move(actions)),
      model_(model),
      be_(backend),
      comm_(comm),
      tracker_(tracker),
      type_(compute_comm_type(backend)),
      boundary_bytes_(static_cast<size_t>(model.boundary_elems()) * backend.compute_elem_size()) {
  for (const Action& a : actions_) {
    ZD_CHECK_INPUT(a.chunk == 0,
                   "pipeline runner: {} of chunk {}: more than one virtual stage per rank "
                   "(interleaved 1F1B) is not implemented yet",
                   describe(a), a.chunk);
  }
  for (const Action& a : actions_) {
    ZD_CHECK(is_compute(a.kind) || comm_ != nullptr, "pipeline runner: {} without a communicator",
             describe(a));
  }
  const int need = slots_needed(actions_);
  ZD_CHECK(model_.slots() >= need,
           "pipeline runner: the schedule keeps {} micro-batches live, the "
           "stage's model has {} activation slots",
           need, model_.slots());
}

void PipelineRunner::receive(void* data, int peer, int tag) {
  comm_->recv_async(data, model_.boundary_elems(), type_, peer, tag)->wait();
}

void PipelineRunner::send(const void* data, int peer, int tag) {
  pending_.push_back({comm_->send_async(data, model_.boundary_elems(), type_, peer, tag), -1});
}

int PipelineRunner::grad_send_buffer() {
  // Buffers whose sends finished are free again.
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->buffer >= 0 && it->work->done()) {
      it->work->wait();  // (rethrows a failure)
      pool_busy_[static_cast<size_t>(it->buffer)] = false;
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
  for (size_t i = 0; i < pool_.size(); ++i) {
    if (!pool_busy_[i]) {
      pool_busy_[i] = true;
      return static_cast<int>(i);
    }
  }
  pool_.push_back(be_.allocate(boundary_bytes_, MemCategory::kActivations, tracker_));
  pool_busy_.push_back(true);
  return static_cast<int>(pool_.size()) - 1;
}

void PipelineRunner::wait_sends() {
  for (Pending& p : pending_) {
    p.work->wait();
    if (p.buffer >= 0) pool_busy_[static_cast<size_t>(p.buffer)] = false;
  }
  pending_.clear();
}

void PipelineRunner::abandon_sends() {
  // The sends still posted read buffers this runner owns: let them finish or fail first.
  for (Pending& p : pending_) {
    try {
      p.work->wait();
    } catch (...) {  // (the error that brought us here is the one to report)
    }
  }
  pending_.clear();
  std::fill(pool_busy_.begin(), pool_busy_.end(), false);
}

double PipelineRunner::run(const std::vector<MicroBatch>& batches, ParamSource& params,
                           GradSink& grads, float loss_weight,
                           const std::function<void(int)>& before_backward) {
  timeline_.clear();
  Stopwatch clock;
  step_start_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  double loss = 0;
  const int slots = model_.slots();
  try {
    for (const Action& a : actions_) {
      ZD_CHECK(a.micro_batch >= 0 && a.micro_batch < static_cast<int>(batches.size()),
               "pipeline runner: {} with {} micro-batches", describe(a), batches.size());
      const int slot = a.micro_batch % slots;
      const int act_tag = 2 * a.micro_batch, grad_tag = act_tag + 1;
      TimedAction t{a, clock.seconds(), 0};
      switch (a.kind) {
        case ActionKind::kForward: {
          const MicroBatch& mb = batches[static_cast<size_t>(a.micro_batch)];
          loss += model_.stage_forward(slot, mb.inputs, mb.targets, params, loss_weight);
          break;
        }
        case ActionKind::kBackward:
          if (before_backward) before_backward(a.micro_batch);
          model_.stage_backward(slot, params, grads);
          break;
        case ActionKind::kRecvActivation:
          receive(model_.stage_input(slot), a.peer, act_tag);
          break;
        case ActionKind::kSendActivation:
          send(model_.stage_output(slot), a.peer, act_tag);
          break;
        case ActionKind::kRecvGrad:
          receive(model_.stage_output_grad(), a.peer, grad_tag);
          break;
        case ActionKind::kSendGrad: {
          const int i = grad_send_buffer();
          void* buf = pool_[static_cast<size_t>(i)].data();
          be_.copy(buf, model_.stage_input_grad(), boundary_bytes_);
          send(buf, a.peer, grad_tag);
          pending_.back().buffer = i;
          break;
        }
        case ActionKind::kBackwardInput:
          model_.stage_backward_input(slot, params, grads);
          break;
        case ActionKind::kBackwardWeight:
          // (The gradient sink sees the micro-batch's units finish here.)
          if (before_backward) before_backward(a.micro_batch);
          model_.stage_backward_weight(slot, grads);
          break;
      }
      t.end = clock.seconds();
      timeline_.push_back(t);
    }
    wait_sends();
  } catch (...) {
    abandon_sends();
    throw;
  }
  step_seconds_ = clock.seconds();
  return loss;
}

double PipelineRunner::forward_only(const std::vector<MicroBatch>& batches, ParamSource& params) {
  const Model& m = model_;
  const LayerRange& st = m.layout().stage();
  const bool first = st.begin == 0, last = st.end == m.spec().n_layer;
  const int rank = comm_ != nullptr ? comm_->rank() : 0;
  double loss = 0;
  try {
    for (size_t i = 0; i < batches.size(); ++i) {
      const int tag = 2 * static_cast<int>(i);
      if (!first) receive(model_.stage_input(0), rank - 1, tag);
      loss += model_.stage_forward(0, batches[i].inputs, batches[i].targets, params, 0.0f);
      if (!last) {
        // (The next micro-batch's forward overwrites slot 0's output: wait for this send.)
        send(model_.stage_output(0), rank + 1, tag);
        wait_sends();
      }
    }
  } catch (...) {
    abandon_sends();
    throw;
  }
  return loss;
}

double PipelineRunner::bubble_fraction() const {
  if (step_seconds_ <= 0) return 0;
  double busy = 0;
  for (const TimedAction& t : timeline_)
    if (is_compute(t.action.kind)) busy += t.end - t.begin;
  return std::max(0.0, 1.0 - busy / step_seconds_);
}

}  // namespace zerod::pipeline
