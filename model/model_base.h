// What every model implementation shares: the layout, the micro-batch shape, the activation
// allocations, the tokens/targets/losses/logits buffers in the backend's memory, reduced-precision
// rounding, and the timing of forward_backward (ops, phases and the time inside the ZeRO seams).
// An architecture derives from it and implements forward() and forward_backward_impl().
#pragma once

#include <cstdint>
#include <vector>

#include "core/memory.h"
#include "core/timer.h"
#include "kernels/backend.h"
#include "model/model.h"
#include "model/moe_block.h"

namespace zerod {

class ModelBase : public Model {
 public:
  const ParamLayout& layout() const override { return layout_; }
  int batch() const override { return B_; }
  int seq() const override { return seq_; }
  const ContextShard& context() const final { return context_; }
  void set_exchange(Exchange* exchange) final;
  void set_expert_exchange(ExpertExchange* exchange) final {
    if (moe_) moe_->set_expert_exchange(exchange);
  }
  void set_document_masking(int32_t eos_token_id) final;

  // Logits through run_to_logits, then the mean loss.
  float forward(const int32_t* inputs, const int32_t* targets, ParamSource& params) final;
  // Times the phases when timing is on, then runs forward_backward_impl.
  float forward_backward(const int32_t* inputs, const int32_t* targets, ParamSource& params,
                         GradSink& grads, float loss_weight) final;
  void read_logits(float* out) final;
  void start_generation(int max_len) final;
  void generate_step(const int32_t* tokens, int n, int pos0, ParamSource& params,
                     float* last_logits) final;

  int slots() const final { return static_cast<int>(slots_.size()); }
  int64_t boundary_elems() const final { return rows() * layout_.spec().n_embd; }
  void* stage_input(int slot) final;
  const void* stage_output(int slot) final;
  float stage_forward(int slot, const int32_t* inputs, const int32_t* targets, ParamSource& params,
                      float loss_weight) final;
  void* stage_output_grad() final;
  void stage_backward(int slot, ParamSource& params, GradSink& grads) final;
  const void* stage_input_grad() final;
  void stage_backward_input(int slot, ParamSource& params, GradSink& grads) final;
  void stage_backward_weight(int slot, GradSink& grads) final;

  MoeStepStats moe_stats() const final { return moe_ ? moe_->stats() : MoeStepStats{}; }
  int moe_totals_size() const final { return moe_ ? moe_->totals_size() : 0; }
  void moe_totals(int slot, double* out) const final { moe_->totals(slot, out); }
  void set_moe_totals(int slot, const double* in, bool final) final {
    moe_->set_totals(slot, in, final);
  }

  void set_timing(bool on) final { timing_ = on; }
  const OpTimes& times() const final { return times_; }
  void reset_times() final { times_ = OpTimes{}; }

 protected:
  // Checks the micro-batch against the spec (under context parallelism, that its sequences split
  // into 2C chunks; under sequence parallelism, that its N = B x T/C rows split T ways:
  // InputError) and allocates tokens, targets, losses and logits for this rank's N rows.
  // A pipeline stage's model (stage: its layers) holds `slots` micro-batches' tokens, targets,
  // losses, residual stream and (last stage) logits; the derived class its saved activations
  // per slot (select_saved).
  ModelBase(const ModelSpec& spec, Backend& backend, int B, int T, bool activation_checkpointing,
            MemoryTracker* tracker, TensorShard shard, ContextShard context, LayerRange stage,
            int slots);
  // The bytes the constructor above allocates per slot (tokens, targets, losses: N fp32 words
  // each; logits on the last stage: N x Vp/T compute elements; tensor-parallel: the 3N loss
  // statistics), not counting the residual stream.
  static int64_t base_activation_bytes(const LocalDims& d, int tensor_parallel, int B, int T,
                                       size_t esz, bool last_stage = true);
  // The rows of the sequence-split regions (norms, residual stream) of a micro-batch of B x T
  // on a shard: N / T under sequence parallelism, else N = B x T.
  static int64_t local_rows(const TensorShard& shard, int B, int T);

  virtual float forward_backward_impl(const int32_t* inputs, const int32_t* targets,
                                      ParamSource& params, GradSink& grads, float loss_weight) = 0;
  // The stage's forward of the uploaded micro-batch of the current slot (through the loss and
  // dlogits for dloss on the last stage). hold: leave the head's units acquired for the backward
  // that follows at once (forward_backward); else every unit is released.
  virtual void stage_forward_impl(ParamSource& params, float dloss, bool hold) = 0;
  // The stage's backward of the current slot; held: the head's units are still acquired from a
  // stage_forward_impl with hold.
  virtual void stage_backward_impl(ParamSource& params, GradSink& grads, bool held) = 0;
  // Points the derived class's saved activations at slot k's.
  virtual void select_saved(int k) = 0;
  // Makes slot k current: tokens_, targets_, losses_, logits_, res_, ... and select_saved(k).
  void select_slot(int k);
  bool first_stage() const { return layout_.stage().begin == 0; }
  bool last_stage() const { return layout_.stage().end == layout_.spec().n_layer; }
  // Logits (B,T,Vp) of tokens_ into logits_, every unit released again (generation).
  virtual void run_to_logits(ParamSource& params) = 0;

  // Attention of block l: attention_forward, or while generating attention_kv_cache over the
  // block's cache (lse is then not written), or context-parallel the exchange's over the whole
  // sequences (lse: its statistics).
  void attend(int l, void* out, float* lse, const void* qkv, const AttentionShape& s);
  // Its backward: attention_backward, or the exchange's (context parallelism).
  void attend_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                       const float* lse, const AttentionShape& s);
  // The position of row 0 of the micro-batch: 0, or pos0 of the generate_step running (not
  // context-parallel: its rows' positions are positions()).
  int position_offset() const { return cache_pos0_ > 0 ? cache_pos0_ : 0; }
  // Context parallelism (C > 1): T_ = seq_/C rows per sequence at the global positions
  // positions() (T_ of them, context_positions' load-balanced split), in runs of consecutive ones.
  bool context_parallel() const { return context_.size > 1; }
  const std::vector<int32_t>& positions() const { return positions_; }
  struct PositionRun {
    int row, pos, len;  // rows [row, row + len) of a sequence are positions [pos, pos + len)
  };
  const std::vector<PositionRun>& position_runs() const { return position_runs_; }

  // Activations in the compute dtype / fp32 statistics, one allocation each (64-byte aligned,
  // visible in the memory report).
  void* act(size_t elems);
  float* stat(size_t elems);
  // x (n) rounded to the compute dtype where the backend emulates it (timed as rounding).
  void round(void* x, int64_t n);
  // round() of all of logits_ (the head's matmul leaves them unrounded: the fused cross-entropy
  // of training rounds each row itself; evaluation, generation and the vocabulary-parallel loss
  // call this).
  void round_logits() { round(logits_, int64_t{B_} * T_ * layout_.local().vocab_rows); }
  Backend* timer() { return timing_ ? &be_ : nullptr; }  // for timed()
  // inputs and targets (host) into tokens_ and targets_ (the backend's memory). Tensor-parallel,
  // tokens_ holds the rows of this rank's vocabulary shard (-1: a token another rank holds).
  // With document masking also the micro-batch's document starts (from the inputs) into
  // doc_start_.
  void upload(const int32_t* inputs, const int32_t* targets);
  // The (B,T) document starts of the micro-batch for the ops (AttentionShape::doc_start, the
  // encoder's): doc_start_ with document masking on, null without it and while generating.
  const int32_t* doc_start() const {
    return eos_token_id_ >= 0 && cache_pos0_ < 0 ? doc_start_ : nullptr;
  }
  bool tensor_parallel() const { return layout_.shard().size > 1; }
  // Megatron's sequence parallelism: the norm and residual regions hold rows() = N/T rows (this
  // rank's block of the N = B x T positions), the matmuls and attention all N.
  bool sequence_parallel() const { return tensor_parallel() && layout_.shard().sequence_parallel; }
  int64_t rows() const { return local_rows(layout_.shard(), B_, T_); }
  // Which buffer holds the side of an exchange point that differs under sequence parallelism:
  // `sp` (sized for it) then, else `x` (part and full are one buffer).
  void* sp_or(void* sp, void* x) const { return sequence_parallel() ? sp : x; }
  // Tensor-parallel (T > 1): the exchange at point p between this rank's rows `part` (rows() x
  // width) and all N rows `full` (the same buffer without sequence parallelism); nothing on one
  // rank (model/exchange.h).
  void exchange_forward(ExchangePoint p, void* part, void* full, int64_t width) {
    if (tensor_parallel()) exchange_->forward(p, part, full, int64_t{B_} * T_, width);
  }
  void exchange_backward(ExchangePoint p, void* part, void* full, int64_t width) {
    if (tensor_parallel()) exchange_->backward(p, part, full, int64_t{B_} * T_, width);
  }
  // losses_ and logits_ (as the head's matmul left them, unrounded) -> dlogits (in place, at the
  // compute dtype's precision) for the per-position loss gradient dloss: the fused cross-entropy,
  // or its vocabulary-parallel form over the tensor group.
  void loss_and_dlogits(float dloss);
  // Mean of the losses of the positions whose target is >= 0 (read back from the backend;
  // context-parallel: over the whole micro-batch, summed over the context group).
  float mean_loss(const int32_t* targets);
  // The gradient of each position's loss: loss_weight / (positions with a target; context-
  // parallel: in the whole micro-batch).
  float loss_gradient(const int32_t* targets, float loss_weight) const;
  // Called once the loss is computed: ends the forward phase of a timed forward_backward.
  void forward_phase_done();

  // The backward's gradient seams, which a split backward (stage_backward_input) defers: the
  // architectures call these instead of the GradSink's and the Backend's. grad_buffer: unit u's
  // gradient buffer. matmul_backward: Backend::matmul_backward, or split, its input gradient and
  // dbias now and dweight (inside a buffer from grad_buffer) in the weight pass, from copies of
  // dout and inp (dout_kept: dout stays valid until the slot's next forward, no copy).
  // unit_done: dw (unit u's buffer) rounded to the compute dtype, then GradSink::unit_done, or
  // split, both in the weight pass.
  void* grad_buffer(GradSink& grads, int u);
  void matmul_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                       const void* weight, int64_t N, int C, int OC, bool accumulate_dinp,
                       bool dout_kept = false);
  void unit_done(GradSink& grads, int u, void* dw);
  bool splitting_backward() const { return split_ != nullptr; }

  ParamLayout layout_;
  Backend& be_;
  int B_, T_;  // T_: the rows of each sequence on this rank (seq_ / C)
  bool checkpointing_;
  bool rounding_;  // compute dtype != fp32 and the backend stores fp32 (emulation)
  size_t esz_;
  MemoryTracker* tracker_;
  std::vector<Buffer> buffers_;

  Exchange* exchange_;
  // The current slot's (select_slot): the residual stream res_[l] for the stage's layers l in
  // [begin, end] ((R,C) each; res_[begin] the stage's input, res_[end] its output; null outside).
  std::vector<void*> res_;
  void* dres_;                        // (R,C) gradient of the residual stream (shared by slots)
  void* logits_;                      // (B,T,Vp/T), becomes dlogits in backward (last stage)
  float* loss_stats_ = nullptr;       // tensor-parallel: (3N) max | target logit | sum of exp
  float* losses_;                     // (B,T)
  int32_t* tokens_;                   // (B,T) the inputs, in the backend's memory
  int32_t* targets_;                  // (B,T)
  std::vector<float> host_losses_;    // (B,T)
  std::vector<int32_t> host_tokens_;  // tensor-parallel: tokens_ before upload
  int32_t eos_token_id_ = -1;         // >= 0: document masking on
  int32_t* doc_start_ = nullptr;      // (B,T) document masking, in the backend's memory
  std::vector<int32_t> host_doc_start_;

  bool timing_ = false;
  OpTimes times_;
  // The MoE blocks' MLPs (spec().moe enabled; null for a dense model), for B x T rows.
  std::unique_ptr<MoeLayers> moe_;
  // A block's units: the block's own and, for a MoE block, its experts unit
  // (ParamLayout::experts_unit), whose weights and gradient buffer the calls below keep in
  // experts_w_ / experts_dw_ for the block's MoE MLP (null for a dense block). acquire_block
  // returns the block unit's weights, block_grads its gradient buffer; block_done finishes the
  // experts unit, then the block unit (units finish in decreasing order).
  void prefetch_block(ParamSource& params, int l);
  const void* acquire_block(ParamSource& params, int l);
  void release_block(ParamSource& params, int l);
  void* block_grads(GradSink& grads, int l);
  void block_done(GradSink& grads, int l, void* dw);
  const void* experts_w_ = nullptr;
  void* experts_dw_ = nullptr;

 private:
  // Context parallelism: this rank's rows of (B, seq_) host inputs and targets (B, T_).
  void select_rows(const int32_t* in, std::vector<int32_t>& out) const;
  // Context parallelism: points inputs and targets at this rank's rows of them and counts the
  // positions with a target in the whole micro-batch; nothing otherwise.
  void take_rows(const int32_t*& inputs, const int32_t*& targets);

  struct Slot {  // one micro-batch's buffers (see select_slot)
    void* logits = nullptr;
    float* losses = nullptr;
    int32_t* tokens = nullptr;
    int32_t* targets = nullptr;
    int32_t* doc_start = nullptr;
    float* loss_stats = nullptr;
    std::vector<void*> res;
  };
  std::vector<Slot> slots_;
  int slot_ = 0;

  // The split backward's weight pass of one slot: in order, matmul weight gradients (offset:
  // dweight's byte offset in unit's gradient buffer; the operands in stash buffers, or dout
  // kept) and unit completions (offset -1).
  struct Deferred {
    int unit = 0;
    int64_t offset = -1;
    int dout = -1, inp = -1;  // stash_ indices (dout -1: dout_ptr)
    const void* dout_ptr = nullptr;
    int64_t N = 0;
    int C = 0, OC = 0;
  };
  std::vector<std::vector<Deferred>> deferred_;  // per slot
  std::vector<Deferred>* split_ = nullptr;       // the slot's, while stage_backward_input runs
  // The gradient buffers handed out during the split backward (unit, base), to find a dweight's
  // unit and offset.
  std::vector<std::pair<int, const char*>> split_bases_;
  // Copies of the deferred operands, reused across steps (a buffer is taken again only by its
  // exact size).
  std::vector<Buffer> stash_;
  std::vector<bool> stash_busy_;
  int stash(const void* src, size_t bytes);

  ContextShard context_;
  int seq_;                                      // positions per sequence of a micro-batch
  std::vector<int32_t> positions_;               // context-parallel: (T_) global positions
  std::vector<PositionRun> position_runs_;       // context-parallel: positions_ as runs
  std::vector<int32_t> cp_inputs_, cp_targets_;  // context-parallel: (B, T_) this rank's rows
  int64_t global_valid_ = 0;  // context-parallel: positions with a target in the micro-batch

  std::vector<Buffer> cache_buffers_;  // per layer: keys, values (B, cache_len_, kv_dim)
  std::vector<void*> kcache_, vcache_;
  int cache_len_ = 0;
  int cache_pos0_ = -1;  // >= 0 while generate_step runs

  // While a timed forward_backward runs: its clock, its seam time, and both at the loss.
  const Stopwatch* phase_clock_ = nullptr;
  const double* phase_seam_ = nullptr;
  IdentityExchange identity_;
  double forward_wall_ = 0, forward_seam_ = 0;
};

}  // namespace zerod
