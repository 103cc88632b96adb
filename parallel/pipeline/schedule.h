// Pipeline schedules as data (DESIGN.md section 8): one function per schedule returns, for each
// of the P pipeline ranks, the ordered list of actions that rank runs for one step of M
// micro-batches; one runner executes any list, and parallel/pipeline/simulate.h checks and times
// them without a model.
//
// Stages. With V virtual stages (chunks) per rank there are P x V model stages; rank r holds
// chunks c = 0..V-1, which are the global stages s = c x P + r (Megatron's interleaving: stage
// s + 1 lives on rank (r + 1) mod P). V = 1 is the plain pipeline: stage s on rank s.
//
// Communication. A forward on a stage other than the first is preceded by a recv-activation of
// that micro-batch from the previous stage's rank and a forward on a stage other than the last
// is followed by a send-activation to the next stage's rank; the backward's gradient goes the
// other way (recv-grad before, send-grad after). Between the chunks of one rank (P = 1 with
// V > 1) nothing is sent. Sends are non-blocking (the runner posts them and goes on; the tensor
// stays alive until the receiver has it) and receives block; everything one rank sends another,
// activations and gradients alike, is one ordered stream (comm's point-to-point messages match by
// order per ordered pair of ranks), so the receiver lists them in the order they are sent
// (simulate.h checks this).
#pragma once

#include <string>
#include <vector>

namespace zerod::pipeline {

enum class ActionKind : unsigned char {
  kForward,         // F: the stage's forward of one micro-batch
  kBackward,        // B: the full backward (input and weight gradients)
  kBackwardInput,   // Bi: the input (activation) gradient only (zero-bubble)
  kBackwardWeight,  // W: the weight gradient of a micro-batch whose Bi ran (zero-bubble)
  kSendActivation,  // the forward's output to the next stage's rank
  kRecvActivation,  // the forward's input from the previous stage's rank
  kSendGrad,        // the backward's input gradient to the previous stage's rank
  kRecvGrad,        // the gradient of the forward's output from the next stage's rank
};
const char* action_kind_name(ActionKind k);  // "F", "B", "Bi", "W", "send_act", ...
bool is_compute(ActionKind k);               // F, B, Bi, W

struct Action {
  ActionKind kind = ActionKind::kForward;
  int micro_batch = 0;  // 0..M-1
  int chunk = 0;        // this rank's virtual stage 0..V-1 (global stage chunk x P + rank)
  int peer = -1;        // the other pipeline rank of a send/recv; -1 for compute

  bool operator==(const Action&) const = default;
};
std::string describe(const Action& a);  // "F(mb 3, chunk 0)", "send_act(mb 3, chunk 0 -> rank 2)"

// One list per pipeline rank, in execution order.
using Schedule = std::vector<std::vector<Action>>;

enum class ScheduleKind : unsigned char { kGPipe, kOneFOneB, kInterleaved1F1B, kZeroBubbleH1 };
// The names of the config's parallelism.pipeline_schedule: "gpipe", "1f1b", "interleaved_1f1b",
// "zero_bubble".
const std::vector<std::string>& schedule_names();
const char* schedule_name(ScheduleKind k);
bool parse_schedule_name(const std::string& name, ScheduleKind& out);

// The global stage of a rank's chunk, and the rank and chunk of a global stage.
inline int global_stage(int rank, int chunk, int ranks) {
  return chunk * ranks + rank;
}
inline int stage_rank(int stage, int ranks) {
  return stage % ranks;
}
inline int stage_chunk(int stage, int ranks) {
  return stage / ranks;
}

// What the schedule needs of P ranks, M micro-batches and V chunks per rank; "" when they fit,
// else why not, naming the numbers (the config parser reports it under parallelism.*):
// every schedule wants P, M, V >= 1; 1F1B and zero-bubble want M >= P (fewer micro-batches
// than stages leave ranks idle with nothing to overlap; use gpipe); interleaved wants M a
// multiple of P; V > 1 only with interleaved.
std::string schedule_problem(ScheduleKind k, int ranks, int micro_batches, int virtual_stages);

// GPipe: every forward, then every backward (micro-batch order both), so all M micro-batches'
// activations are live at once on every stage.
Schedule gpipe_schedule(int ranks, int micro_batches);
// 1F1B (PipeDream-Flush, Megatron's default): rank r runs min(P-1-r, M) warm-up forwards, then
// alternates one forward and one backward, then drains the remaining backwards: at most P - r
// micro-batches are live on rank r.
Schedule one_f_one_b_schedule(int ranks, int micro_batches);
// Megatron's interleaved 1F1B: V chunks per rank; forwards go over the chunks in groups of P
// micro-batches (chunk 0 of micro-batches 0..P-1, chunk 1 of the same, ..., then the next P),
// backwards the same with the chunks reversed; rank r runs (P-1-r) x 2 + (V-1) x P warm-up
// forwards (at most M x V), then one forward and one backward alternately. M a multiple of P.
Schedule interleaved_1f1b_schedule(int ranks, int micro_batches, int virtual_stages);
// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2024): 1F1B with each backward split
// into its input gradient Bi (on the critical path, sent upstream at once) and its weight
// gradient W, which rank r runs r backwards late, the deferred ones at the end, where they fill
// the cool-down's waits. With F = Bi = W its bubble is a third of 1F1B's, and the first stage
// still holds at most P micro-batches (activations live from F to W).
Schedule zero_bubble_h1_schedule(int ranks, int micro_batches);

// The most micro-batches live at once on this rank of the list (from F to B, or to W), of one
// chunk (chunk >= 0) or the most of any chunk (-1): the activation slots its stage models need.
int slots_needed(const std::vector<Action>& actions, int chunk = -1);

// The most micro-batches between their Bi and their W at once in one rank's list (0 without a
// split backward): each holds the stage model's split_backward_bytes (model/model.h).
int weight_passes_pending(const std::vector<Action>& actions);

// The schedule of kind k (V is used by interleaved only, and must be 1 for the others). With
// P = 1 every schedule is the plain micro-batch loop: for each micro-batch the forwards of the
// chunks in order and the full backwards in reverse. Throws InputError for schedule_problem.
Schedule make_schedule(ScheduleKind k, int ranks, int micro_batches, int virtual_stages = 1);

}  // namespace zerod::pipeline
