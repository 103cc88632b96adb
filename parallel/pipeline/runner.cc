#include "parallel/pipeline/runner.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string_view>

#include "core/env.h"
#include "core/error.h"
#include "zero/compute_comm.h"

namespace zerod::pipeline {

size_t parse_pipeline_prefetch(const char* value) {
  return static_cast<size_t>(env_count("ZEROD_PIPELINE_PREFETCH", value, 0, 16, 2,
                                       "how many receives a pipeline rank posts ahead of their "
                                       "actions"));
}

PipelineRunner::PipelineRunner(std::vector<Action> actions, Model& model, Backend& backend,
                               Communicator* comm, MemoryTracker* tracker)
    : PipelineRunner(std::move(actions), std::vector<Model*>{&model}, model.layout(), backend, comm,
                     tracker) {}

PipelineRunner::PipelineRunner(std::vector<Action> actions, std::vector<Model*> chunks,
                               const ParamLayout& rank_layout, Backend& backend, Communicator* comm,
                               MemoryTracker* tracker)
    : actions_(std::move(actions)),
      chunks_(std::move(chunks)),
      be_(backend),
      comm_(comm),
      tracker_(tracker),
      type_(compute_comm_type(backend)),
      prefetch_(parse_pipeline_prefetch(std::getenv("ZEROD_PIPELINE_PREFETCH"))) {
  // NCCL runs a communicator's messages in issue order on one stream: a receive posted ahead
  // would hold back the sends issued after it (its peer may wait for one of those first).
  if (comm_ != nullptr && std::string_view(comm_->backend()) != "gloo") prefetch_ = 0;
  ZD_CHECK(!chunks_.empty(), "pipeline runner without a model");
  const int V = static_cast<int>(chunks_.size());
  ranks_ = comm_ != nullptr ? comm_->size() : 1;
  rank_ = comm_ != nullptr ? comm_->rank() : 0;
  stages_ = ranks_ * V;
  boundary_bytes_ = static_cast<size_t>(chunks_[0]->boundary_elems()) * backend.compute_elem_size();
  totals_size_ = comm_ != nullptr ? chunks_[0]->moe_totals_size() : 0;
  for (const Action& a : actions_) {
    ZD_CHECK_INPUT(a.chunk >= 0 && a.chunk < V,
                   "pipeline runner: {} of chunk {}: this rank holds {} virtual stage{}",
                   describe(a), a.chunk, V, V == 1 ? "" : "s");
    ZD_CHECK(is_compute(a.kind) || comm_ != nullptr, "pipeline runner: {} without a communicator",
             describe(a));
  }
  if (V > 1) {
    ZD_CHECK_INPUT(ranks_ >= 2, "pipeline runner: {} virtual stages on one pipeline rank", V);
    for (Model* m : chunks_) {
      ZD_CHECK(m->boundary_elems() == chunks_[0]->boundary_elems(),
               "pipeline chunks with different boundaries");
      seams_.push_back(std::make_unique<ChunkSeams>(m->layout(), rank_layout));
    }
  }
  for (int c = 0; c < V; ++c) {
    const int need = slots_needed(actions_, c);
    ZD_CHECK(chunk(c).slots() >= need,
             "pipeline runner: the schedule keeps {} micro-batches of chunk {} live, its model "
             "has {} activation slots",
             need, c, chunk(c).slots());
  }
}

PipelineRunner::~PipelineRunner() = default;

int PipelineRunner::tag(int m, int boundary, bool grad) const {
  return 2 * (m * stages_ + boundary) + (grad ? 1 : 0);
}

int PipelineRunner::receive_tag(const Action& a) const {
  const int s = stage_of(a.chunk);
  const bool grad = a.kind == ActionKind::kRecvGrad;  // (its boundary is below or above s)
  return tag(a.micro_batch, grad ? s : s - 1, grad);
}

ChunkSeams* PipelineRunner::seams(int c, ParamSource& params, GradSink* grads) {
  if (seams_.empty()) return nullptr;
  ChunkSeams* s = seams_[static_cast<size_t>(c)].get();
  s->bind(&params, grads);
  return s;
}

void PipelineRunner::receive(void* data, int peer, int tag) {
  comm_->recv_async(data, chunks_[0]->boundary_elems(), type_, peer, tag)->wait();
}

void PipelineRunner::send_totals(Model& model, int slot, int peer, int tag) {
  if (totals_size_ == 0) return;
  auto buf = std::make_shared<std::vector<double>>(static_cast<size_t>(totals_size_));
  model.moe_totals(slot, buf->data());
  pending_.push_back({comm_->send_async(buf->data(), totals_size_, CommType::kF64, peer, tag), -1});
  totals_sent_.push_back(std::move(buf));
}

WorkPtr PipelineRunner::receive_totals(const Action& a,
                                       std::shared_ptr<std::vector<double>>& into) {
  into = std::make_shared<std::vector<double>>(static_cast<size_t>(totals_size_));
  return comm_->recv_async(into->data(), totals_size_, CommType::kF64, a.peer, receive_tag(a));
}

void PipelineRunner::send(const void* data, int peer, int tag) {
  pending_.push_back({comm_->send_async(data, chunks_[0]->boundary_elems(), type_, peer, tag), -1});
}

int PipelineRunner::pool_buffer() {
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

void PipelineRunner::prefetch_receives(size_t from) {
  next_receive_ = std::max(next_receive_, from);
  while (prefetched_.size() < prefetch_ && next_receive_ < actions_.size()) {
    const size_t j = next_receive_++;
    const Action& a = actions_[j];
    if (a.kind != ActionKind::kRecvActivation && a.kind != ActionKind::kRecvGrad) continue;
    const int i = pool_buffer();
    Prefetched p{j,
                 comm_->recv_async(pool_[static_cast<size_t>(i)].data(),
                                   chunks_[0]->boundary_elems(), type_, a.peer, receive_tag(a)),
                 i, nullptr, nullptr};
    if (totals_size_ > 0) p.totals_work = receive_totals(a, p.totals);  // (right after: in order)
    prefetched_.push_back(std::move(p));
  }
}

std::shared_ptr<std::vector<double>> PipelineRunner::take_receive(size_t index, void* data) {
  if (prefetch_ == 0) {  // posted here, as the schedule reaches it
    const Action& a = actions_[index];
    receive(data, a.peer, receive_tag(a));
    std::shared_ptr<std::vector<double>> totals;
    if (totals_size_ > 0) receive_totals(a, totals)->wait();
    return totals;
  }
  prefetch_receives(index);
  ZD_CHECK(!prefetched_.empty() && prefetched_.front().action == index,
           "pipeline runner: {} was not posted ahead", describe(actions_[index]));
  Prefetched r = std::move(prefetched_.front());
  prefetched_.erase(prefetched_.begin());
  prefetch_receives(index + 1);  // (the next ones travel meanwhile)
  r.work->wait();
  be_.copy(data, pool_[static_cast<size_t>(r.buffer)].data(), boundary_bytes_);
  pool_busy_[static_cast<size_t>(r.buffer)] = false;
  if (r.totals_work) {
    try {
      r.totals_work->wait();
    } catch (...) {
      totals_lost_.push_back(r.totals);  // (it may still land)
      throw;
    }
  }
  return r.totals;
}

void PipelineRunner::abandon_receives() {
  for (Prefetched& r : prefetched_) {
    try {
      r.work->wait();
      pool_busy_[static_cast<size_t>(r.buffer)] = false;
    } catch (...) {  // (still posted, perhaps: its buffer stays busy)
    }
    if (r.totals_work) {
      try {
        r.totals_work->wait();
      } catch (...) {
        totals_lost_.push_back(r.totals);
      }
    }
  }
  prefetched_.clear();
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
    // (Only the sends' buffers: a receive that failed may still land in its buffer, which
    // abandon_receives and take_receive leave busy.)
    if (p.buffer >= 0) pool_busy_[static_cast<size_t>(p.buffer)] = false;
  }
  pending_.clear();
}

double PipelineRunner::run(const std::vector<MicroBatch>& batches, ParamSource& params,
                           GradSink& grads, float loss_weight,
                           const std::function<void(int)>& before_backward) {
  timeline_.clear();
  Stopwatch clock;
  step_start_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  double loss = 0;
  next_receive_ = 0;
  try {
    if (comm_ != nullptr) prefetch_receives(0);
    for (size_t index = 0; index < actions_.size(); ++index) {
      const Action& a = actions_[index];
      ZD_CHECK(a.micro_batch >= 0 && a.micro_batch < static_cast<int>(batches.size()),
               "pipeline runner: {} with {} micro-batches", describe(a), batches.size());
      Model& model = chunk(a.chunk);
      const int slot = a.micro_batch % model.slots();
      const int s = stage_of(a.chunk);
      TimedAction t{a, clock.seconds(), 0};
      ChunkSeams* mapped = seams(a.chunk, params, &grads);
      ParamSource& p = mapped != nullptr ? *mapped : params;
      GradSink& g = mapped != nullptr ? *mapped : grads;
      switch (a.kind) {
        case ActionKind::kForward: {
          const MicroBatch& mb = batches[static_cast<size_t>(a.micro_batch)];
          loss += model.stage_forward(slot, mb.inputs, mb.targets, p, loss_weight);
          break;
        }
        case ActionKind::kBackward:
          if (before_backward) before_backward(a.micro_batch);
          model.stage_backward(slot, p, g);
          break;
        case ActionKind::kBackwardInput:
          model.stage_backward_input(slot, p, g);
          break;
        case ActionKind::kBackwardWeight:
          // (The gradient sink sees the micro-batch's units finish here.)
          if (before_backward) before_backward(a.micro_batch);
          model.stage_backward_weight(slot, g);
          break;
        case ActionKind::kRecvActivation:
          if (auto totals = take_receive(index, model.stage_input(slot)))
            model.set_moe_totals(slot, totals->data(), /*final=*/false);
          break;
        case ActionKind::kSendActivation:
          send(model.stage_output(slot), a.peer, tag(a.micro_batch, s, false));
          send_totals(model, slot, a.peer, tag(a.micro_batch, s, false));
          break;
        case ActionKind::kRecvGrad:
          if (auto totals = take_receive(index, model.stage_output_grad()))
            model.set_moe_totals(slot, totals->data(), /*final=*/true);
          break;
        case ActionKind::kSendGrad: {
          const int i = pool_buffer();
          void* buf = pool_[static_cast<size_t>(i)].data();
          be_.copy(buf, model.stage_input_grad(), boundary_bytes_);
          send(buf, a.peer, tag(a.micro_batch, s - 1, true));
          pending_.back().buffer = i;
          send_totals(model, slot, a.peer, tag(a.micro_batch, s - 1, true));
          break;
        }
      }
      t.end = clock.seconds();
      timeline_.push_back(t);
    }
    ZD_CHECK(prefetched_.empty(), "pipeline runner: receives posted beyond the step");
    wait_sends();
    totals_sent_.clear();
  } catch (...) {
    abandon_receives();
    abandon_sends();
    totals_sent_.clear();
    throw;
  }
  step_seconds_ = clock.seconds();
  return loss;
}

double PipelineRunner::forward_only(const std::vector<MicroBatch>& batches, ParamSource& params) {
  const int V = static_cast<int>(chunks_.size());
  const int prev = (rank_ + ranks_ - 1) % ranks_, next = (rank_ + 1) % ranks_;
  double loss = 0;
  try {
    for (size_t i = 0; i < batches.size(); ++i) {
      const int m = static_cast<int>(i);
      for (int c = 0; c < V; ++c) {
        Model& model = chunk(c);
        const int s = stage_of(c);
        if (s > 0) receive(model.stage_input(0), prev, tag(m, s - 1, false));
        ChunkSeams* mapped = seams(c, params, nullptr);
        loss += model.stage_forward(0, batches[i].inputs, batches[i].targets,
                                    mapped != nullptr ? *mapped : params, 0.0f);
        if (s + 1 < stages_) {
          // (The next micro-batch's forward overwrites slot 0's output: wait for this send.)
          send(model.stage_output(0), next, tag(m, s, false));
          wait_sends();
        }
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
