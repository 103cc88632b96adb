// The pipeline runner (DESIGN.md section 8): executes one rank's action list of a schedule
// (schedule.h) over the model of its stage, exchanging the boundary activations and their
// gradients with the neighbouring stages by point-to-point messages on the pipeline group's
// communicator. One runner for every schedule; with P = 1 it is the plain micro-batch loop.
//
// Per action: F runs Model::stage_forward in the micro-batch's activation slot (slot = micro-batch
// mod slots(): a rank's micro-batches are live from F to B in micro-batch order, so at most
// slots_needed() of them at once, and m mod slots never meets a live one); B runs
// stage_backward; Bi and W (zero-bubble) its two passes, stage_backward_input and
// stage_backward_weight (the ZeRO engine's begin_micro_batch is called before W, where the units
// finish, and for B before B); receives are posted ahead (recv_async into pooled staging buffers,
// the next 2 of the list in its order, so that a message travels while the rank
// computes: Gloo moves a message only once its receive is posted; ZEROD_PIPELINE_PREFETCH=N sets
// how many, 0 to post each at its action; on NCCL, whose messages run in issue order on one
// stream, none), and a receive action waits for
// its message and copies it into the model's buffer (receives block, as the schedule assumes);
// a send posts send_async and goes on: activations
// straight from the slot's output (alive until the slot's next forward, after the peer's backward
// of it has answered), gradients from a copy in a pooled buffer (the model's gradient buffer is
// reused by the next backward). Every send is waited for before run() returns. Each message carries
// the tag 2 x micro-batch (+1 for gradients), which the communicator checks on arrival. A model
// with Hugging Face's all-layer aux loss (Model::moe_totals_size() > 0) sends its slot's router
// totals right after each boundary tensor, with the same tag (a pair's messages match by order):
// forward, the sums of the layers so far; backward, the whole model's, set into the slot before
// its backward.
//
// Interleaved schedules (V chunks per rank): one model per chunk, each stage's slots its own;
// messages are tagged by micro-batch and the boundary they cross.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/memory.h"
#include "core/timer.h"
#include "kernels/backend.h"
#include "model/model.h"
#include "model/param_source.h"
#include "parallel/pipeline/chunk_seams.h"
#include "parallel/pipeline/schedule.h"

namespace zerod::pipeline {

// ZEROD_PIPELINE_PREFETCH's value: how many receives the runner posts ahead of their actions
// (unset or "": 2; 0 to 16). Other values are bad input.
size_t parse_pipeline_prefetch(const char* value);

// One micro-batch's tokens (host, B x T each), the same on every stage of a replica.
struct MicroBatch {
  const int32_t* inputs = nullptr;
  const int32_t* targets = nullptr;
};

// What the rank did when, for a step's timeline (Chrome trace) and its measured bubble.
struct TimedAction {
  Action action;
  double begin = 0, end = 0;  // seconds since the step began
};

class PipelineRunner {
 public:
  // actions: this pipeline rank's list; model: its stage, with slots() >= slots_needed(actions);
  // comm: the pipeline group's communicator (this rank's index = its pipeline rank; null when
  // P = 1). Error for actions of chunks > 0.
  PipelineRunner(std::vector<Action> actions, Model& model, Backend& backend, Communicator* comm,
                 MemoryTracker* tracker);
  // Interleaved: chunk c's model (global stage c x P + rank) is chunks[c], each with
  // slots() >= slots_needed(actions, c); rank_layout: the layout of all of them (ParamLayout with
  // chunks), whose units the ParamSource and GradSink of run() and forward_only() index (each
  // chunk model's calls are mapped to it, ChunkSeams). P >= 2 (Error otherwise: neighbouring
  // stages on one rank would pass their boundary without a message).
  PipelineRunner(std::vector<Action> actions, std::vector<Model*> chunks,
                 const ParamLayout& rank_layout, Backend& backend, Communicator* comm,
                 MemoryTracker* tracker);
  ~PipelineRunner();

  // The bytes of the pooled boundary buffers (receives posted ahead, gradients being sent):
  // allocated as the schedule first needs them (how many are busy at once depends on when
  // messages complete), kept for the runner's life, tracked as MemCategory::kActivations.
  int64_t staging_bytes() const {
    return static_cast<int64_t>(pool_.size()) * static_cast<int64_t>(boundary_bytes_);
  }

  // One step over batches (M of them): every action in order. before_backward(m) is called
  // before each backward of micro-batch m (once per chunk), or before its W in a split backward
  // (the ZeRO engine's begin_micro_batch). Returns the sum of the micro-batches' mean losses on
  // the last stage (0 on the others).
  double run(const std::vector<MicroBatch>& batches, ParamSource& params, GradSink& grads,
             float loss_weight, const std::function<void(int)>& before_backward);

  // Forward only (evaluation): each micro-batch through this rank's stages in order (chunk by
  // chunk), receiving from the previous stage and sending to the next. Returns the sum of the
  // mean losses on the last stage.
  double forward_only(const std::vector<MicroBatch>& batches, ParamSource& params);

  // The last run()'s actions with their times, and the fraction of the step this rank spent
  // outside compute (waiting in receives and idle).
  const std::vector<TimedAction>& timeline() const { return timeline_; }
  double bubble_fraction() const;
  // When the last run() began, in seconds of the steady clock (shared by the processes of a
  // host): the origin of its timeline.
  double step_start_seconds() const { return step_start_; }

 private:
  // The message tag of micro-batch m crossing the boundary after global stage b (activation
  // b -> b + 1, or its gradient b + 1 -> b), the same on both sides.
  int tag(int m, int boundary, bool grad) const;
  int receive_tag(const Action& a) const;  // the tag of a receive action's message
  int stage_of(int chunk) const { return chunk * ranks_ + rank_; }
  Model& chunk(int c) { return *chunks_[static_cast<size_t>(c)]; }
  // Chunk c's seams bound to the rank's params and grads (null when V = 1: the rank's own).
  ChunkSeams* seams(int c, ParamSource& params, GradSink* grads);
  void receive(void* data, int peer, int tag);
  void send(const void* data, int peer, int tag);
  int pool_buffer();  // the index of a free pooled buffer of boundary_elems() elements
  void wait_sends();
  void abandon_sends();  // after an error: every posted send finished or failed, its buffer free
  // Posts the receives of actions_[from..] not yet posted, in order, up to prefetch_ at once
  // (each holds a pooled boundary buffer).
  void prefetch_receives(size_t from);
  // Receive action `index` (the oldest prefetched): waits for it, copies it into data; returns
  // the MoE totals that came with it (null without them).
  std::shared_ptr<std::vector<double>> take_receive(size_t index, void* data);
  // With MoE totals (Model::moe_totals_size() > 0: Mixtral's all-layer aux loss): each boundary
  // message is followed by one of the slot's totals (F64) on the same pair, in the same order.
  void send_totals(Model& model, int slot, int peer, int tag);
  // Posts the receive of the totals following receive action a's message into a new buffer.
  WorkPtr receive_totals(const Action& a, std::shared_ptr<std::vector<double>>& into);
  void abandon_receives();  // after an error: their buffers stay busy (a receive may still land)

  std::vector<Action> actions_;
  std::vector<Model*> chunks_;
  std::vector<std::unique_ptr<ChunkSeams>> seams_;  // per chunk; empty when V = 1
  int ranks_ = 1, rank_ = 0, stages_ = 1;           // P, this pipeline rank, P x V
  Backend& be_;
  Communicator* comm_;
  MemoryTracker* tracker_;
  CommType type_;
  size_t boundary_bytes_ = 0;
  struct Pending {
    WorkPtr work;
    int buffer = -1;  // the pooled buffer it sends from (-1: a slot's output)
  };
  std::vector<Pending> pending_;
  struct Prefetched {
    size_t action = 0;  // its index in actions_
    WorkPtr work;
    int buffer = -1;  // the pooled buffer it lands in
    // With MoE totals: the message right after the boundary tensor's, and where it lands.
    WorkPtr totals_work;
    std::shared_ptr<std::vector<double>> totals;
  };
  std::vector<Prefetched> prefetched_;  // in the order of actions_
  int totals_size_ = 0;                 // Model::moe_totals_size() of the chunks
  // The totals this step sends (alive until wait_sends), and receive buffers a failed receive may
  // still write into (kept for the runner's life).
  std::vector<std::shared_ptr<std::vector<double>>> totals_sent_, totals_lost_;
  size_t next_receive_ = 0;             // actions_ before this are posted or not receives
  size_t prefetch_ = 2;                 // ZEROD_PIPELINE_PREFETCH
  std::vector<Buffer> pool_;
  std::vector<bool> pool_busy_;
  std::vector<TimedAction> timeline_;
  double step_seconds_ = 0;
  double step_start_ = 0;
};

}  // namespace zerod::pipeline
