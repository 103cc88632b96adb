// The model interface the engine trains: a decoder-only transformer over a Backend whose weights
// come from a ParamSource and whose gradients go to a GradSink, unit by unit (param_source.h).
// One implementation per architecture family: Gpt (gpt.h) and Llama (llama.h, also Mistral and
// Qwen2). make_model() picks by ModelSpec::arch. Models know no peers: parallelism is applied
// from outside through the seams. A model built for a TensorShard of size T computes its
// tensor-parallel part (model/shard.h) and combines partial results through its Exchange; one
// built for a ContextShard of size C computes the seq/C positions of each sequence its context
// rank holds (the load-balanced causal split) and attends over whole sequences through it.
#pragma once

#include <cstdint>
#include <memory>

#include "core/memory.h"
#include "kernels/backend.h"
#include "model/exchange.h"
#include "model/expert_exchange.h"
#include "model/layout.h"
#include "model/param_source.h"
#include "model/shard.h"

namespace zerod {

// Seconds spent per kind of op (accumulated while enabled). layernorm counts every norm
// (LayerNorm or RMSNorm), gelu the MLP activation (GELU or SwiGLU), attention_* the rotary
// embedding too.
struct OpTimes {
  double encoder = 0, layernorm = 0, matmul_fwd = 0, matmul_bwd = 0, attention_fwd = 0,
         attention_bwd = 0, gelu = 0, residual = 0, classifier = 0, rounding = 0,
         moe = 0;  // the MoE router, permutation and combine (model/moe_block.h)
  // Phases of forward_backward: forward (through the loss) and backward, each without the
  // time spent inside the ParamSource/GradSink (ZeRO gathers and reductions), which is zero_wait.
  double forward = 0, backward = 0, zero_wait = 0;
  double total() const;  // the ops above
  OpTimes& operator+=(const OpTimes& o);  // (field by field: several chunk models' times)
};

class Model {
 public:
  virtual ~Model() = default;

  // This rank's layout (the whole model's unless tensor-parallel).
  virtual const ParamLayout& layout() const = 0;
  const ModelSpec& spec() const { return layout().spec(); }
  // The collectives of a tensor- or context-parallel model (not owned; must outlive the model;
  // null: the identity). Required before the first forward when layout().shard().size > 1 or
  // context().size > 1; unused otherwise. Its sequence_parallel() and context_size() must match
  // the shards' (Error otherwise).
  virtual void set_exchange(Exchange* exchange) = 0;
  // Expert parallelism (model/expert_exchange.h): the group the MoE layers spread their experts
  // over (not owned; null or one rank: every expert here). Ignored by a dense model.
  virtual void set_expert_exchange(ExpertExchange* /*exchange*/) {}
  virtual int batch() const = 0;
  // Positions per sequence of a micro-batch (all of them, also under context parallelism).
  virtual int seq() const = 0;
  virtual const ContextShard& context() const = 0;
  // Document masking for packed sequences (model/document_mask.h), from the next forward on:
  // each micro-batch's inputs give every position the start of its document (a new one after
  // each eos_token_id), attention stays inside documents and positions (GPT-2's learned
  // positions, Llama's rotary angles) restart at 0 in each. eos_token_id < 0: off (the default).
  // Generation is never masked. InputError under context parallelism (the sequence split over
  // ranks is not supported with it).
  virtual void set_document_masking(int32_t eos_token_id) = 0;

  // Mean cross-entropy over the positions whose target is >= 0 (evaluation; no gradients).
  // inputs, targets (B,T), tokens in [0, V), in host memory (copied to the backend's memory).
  // Context-parallel: every rank of the group passes the whole micro-batch, computes its
  // positions' losses, and returns the mean over all of them (the same on every rank).
  virtual float forward(const int32_t* inputs, const int32_t* targets, ParamSource& params) = 0;

  // Forward and backward of one micro-batch. Returns the mean loss. The gradient of
  // loss_weight * mean_loss is accumulated (+=) into the GradSink's buffers (loss_weight folds
  // in the loss scale and 1/gradient_accumulation_steps). Context-parallel: each rank
  // accumulates its positions' part (the per-position gradient is loss_weight / the positions
  // with a target in the whole micro-batch); the sum over the context group is the gradient.
  virtual float forward_backward(const int32_t* inputs, const int32_t* targets, ParamSource& params,
                                 GradSink& grads, float loss_weight) = 0;

  // ---- generation (forward only, one rank, with a KV cache; not tensor-parallel) ----
  // Allocates a KV cache for batch() sequences of up to max_len positions (<= spec().seq_len).
  virtual void start_generation(int max_len) = 0;
  // Runs n new positions pos0 .. pos0 + n - 1 (1 <= n <= seq()) of every sequence: tokens
  // (B, n) in host memory. Their keys and values join the cache, which must hold positions
  // [0, pos0). last_logits (B, Vp) = the fp32 logits of each sequence's last new position, in
  // host memory. The results equal forward() over the whole sequence.
  virtual void generate_step(const int32_t* tokens, int n, int pos0, ParamSource& params,
                             float* last_logits) = 0;

  // After forward(): the logits (B,T,Vp) of that call, converted to fp32, into host memory
  // (out: B*T*Vp floats; tensor-parallel: this rank's Vp/T columns; context-parallel: this
  // rank's T/C positions of each sequence).
  virtual void read_logits(float* out) = 0;

  // ---- pipeline stages (parallel/pipeline/runner.h; DESIGN.md section 8) ----
  // A model built for a LayerRange holds those layers (layout().stage()), and activations for
  // slots() micro-batches at once: a slot holds one micro-batch from its stage_forward to its
  // stage_backward. Boundary tensors (a stage's input and output, their gradients) are (R, C)
  // compute-dtype elements, R the residual stream's rows (B x T, or B x T / T under sequence
  // parallelism): boundary_elems() of them. forward_backward is stage_forward then
  // stage_backward of slot 0 on the whole model. Not with context parallelism (Error).
  virtual int slots() const = 0;
  virtual int64_t boundary_elems() const = 0;
  // Not the first stage: where the previous stage's output for `slot` is put before its
  // stage_forward.
  virtual void* stage_input(int slot) = 0;
  // Not the last stage: the stage's output for `slot`, valid from its stage_forward until the
  // slot's next stage_forward.
  virtual const void* stage_output(int slot) = 0;
  // The stage's forward of the micro-batch inputs, targets (B,T) (host; every stage gets them:
  // the first embeds the inputs, the last computes the loss and, for loss_weight as in
  // forward_backward, its gradient). Returns the mean loss on the last stage, 0 on the others.
  virtual float stage_forward(int slot, const int32_t* inputs, const int32_t* targets,
                              ParamSource& params, float loss_weight) = 0;
  // Not the last stage: where the gradient of the stage's output is put before stage_backward
  // (one buffer for every slot).
  virtual void* stage_output_grad() = 0;
  // The stage's backward of the micro-batch in `slot`: weight gradients into the GradSink (+=).
  virtual void stage_backward(int slot, ParamSource& params, GradSink& grads) = 0;
  // Not the first stage: after stage_backward (or stage_backward_input), the gradient of the
  // stage's input (valid until the next backward of any slot).
  virtual const void* stage_input_grad() = 0;
  // Zero-bubble schedules: stage_backward in two passes. stage_backward_input runs the slot's
  // backward for the gradient of the stage's input and every gradient but the matmuls' weight
  // gradients (norms, biases, the embedding's scatter-add are cheap and stay here), keeping a
  // copy of each weight gradient's operands (dout, inp); stage_backward_weight later accumulates
  // those weight gradients and finishes the slot's units (GradSink::unit_done, which a split
  // backward only calls here, so a unit's gradient buffer is fetched again by unit). Other slots'
  // forwards and backwards may run in between; the slot stays live until its weight pass. The
  // sum of the gradients equals stage_backward's up to the order of floating-point additions.
  virtual void stage_backward_input(int slot, ParamSource& params, GradSink& grads) = 0;
  virtual void stage_backward_weight(int slot, GradSink& grads) = 0;

  // Mixture of experts: the routing and router losses of the last forward or forward_backward
  // (of stage_forward's slot on a pipeline stage); empty for a dense model. The losses it
  // reports were added to the objective (with their coefficients) of that forward_backward;
  // the returned loss is the cross-entropy alone.
  virtual MoeStepStats moe_stats() const = 0;
  // Pipeline stages of a model with Hugging Face's all-layer aux loss (MoeLayers::totals): the
  // router statistics a stage passes on with its boundary tensors, moe_totals_size() doubles (0:
  // none to pass); moe_totals of `slot` (after its forward); set_moe_totals into `slot` before
  // its forward (from the previous stage) or, final, before its backward (the whole model's,
  // from the next stage).
  virtual int moe_totals_size() const { return 0; }
  virtual void moe_totals(int slot, double* out) const {}
  virtual void set_moe_totals(int slot, const double* in, bool final) {}

  virtual void set_timing(bool on) = 0;
  virtual const OpTimes& times() const = 0;
  virtual void reset_times() = 0;
};

// The model of spec.arch for micro-batches of B x T (T <= spec.seq_len); with shard.size > 1
// the part of tensor-parallel rank shard.rank (shard.sequence_parallel: B x T/C must be a
// multiple of shard.size, InputError otherwise); with context.size = C > 1 the T/C positions of
// each sequence that context rank context.rank holds (T must be a multiple of 2C, InputError
// otherwise).
// With a stage (LayerRange), the model of one pipeline stage with activations for `slots`
// micro-batches.
std::unique_ptr<Model> make_model(const ModelSpec& spec, Backend& backend, int B, int T,
                                  bool activation_checkpointing, MemoryTracker* tracker,
                                  TensorShard shard = {}, ContextShard context = {},
                                  LayerRange stage = {}, int slots = 1);

// The bytes make_model's model allocates for activations (MemCategory::kActivations) for a
// micro-batch of B x T, compute elements of esz bytes (statistics are fp32), on one of
// `tensor_parallel` ranks, with or without sequence parallelism (which splits the norm and
// residual regions' B x T rows tensor_parallel ways), on one of `context_parallel` ranks (which
// holds B x T/C rows; the exchange's workspace is not counted).
// A pipeline stage's model (stage, slots as make_model's): its layers and slots only.
int64_t model_activation_bytes(const ModelSpec& spec, int B, int T, bool activation_checkpointing,
                               size_t esz, int tensor_parallel = 1, bool sequence_parallel = false,
                               int context_parallel = 1, LayerRange stage = {}, int slots = 1);

// The bytes a stage model's split backward (stage_backward_input) keeps per micro-batch until its
// weight pass: copies of each matmul's dout and input (B x T rows) for the stage's blocks on one
// of `tensor_parallel` ranks, and the head's input on the last stage (its dout is the slot's
// logits). Allocated on first use and reused: a rank holds this times the most micro-batches
// between their Bi and W at once (pipeline::weight_passes_pending).
int64_t split_backward_bytes(const ModelSpec& spec, int B, int T, size_t esz,
                             int tensor_parallel = 1, LayerRange stage = {});

}  // namespace zerod
