// A GPT-2-architecture transformer over a Backend: learned positions, pre-LayerNorm blocks,
// GELU MLP 4x, tied input/output embedding, vocabulary padded to Vp (the loss covers the real
// V). Weights come from a ParamSource, gradients go to a GradSink, unit by unit (param_source.h).
//
// Per micro-batch of B sequences of T tokens (T <= seq_len), activations are allocated once at
// construction. With activation checkpointing only each block's input is kept and the block is
// recomputed in backward.
#pragma once

#include <cstdint>
#include <vector>

#include "core/memory.h"
#include "core/timer.h"
#include "kernels/backend.h"
#include "model/layout.h"
#include "model/model_base.h"
#include "model/param_source.h"

namespace zerod {

class Gpt final : public ModelBase {
 public:
  // The bytes the constructor allocates for activations (MemCategory::kActivations) for a
  // micro-batch of B x T, compute elements of esz bytes (statistics are fp32), on a rank of
  // `shard` (its local dimensions and, under sequence parallelism, its rows) and of a context
  // group of `context` ranks (its T/context positions of each sequence).
  // A pipeline stage's model: its layers' and `slots` micro-batches' (see the constructor).
  static int64_t activation_bytes(const ModelSpec& spec, const TensorShard& shard, int B, int T,
                                  bool activation_checkpointing, size_t esz, int context = 1,
                                  LayerRange stage = {}, int slots = 1);

  // Context-parallel (context.size = C > 1): the T/C positions of each sequence context rank
  // context.rank holds; the shapes below then have T/C for T, and the position embedding rows
  // are those of the rows' global positions.
  // A pipeline stage (stage: its layers) holds `slots` micro-batches' activations.
  Gpt(const ModelSpec& spec, Backend& backend, int B, int T, bool activation_checkpointing,
      MemoryTracker* tracker, TensorShard shard = {}, ContextShard context = {},
      LayerRange stage = {}, int slots = 1);

 private:
  float forward_backward_impl(const int32_t* inputs, const int32_t* targets, ParamSource& params,
                              GradSink& grads, float loss_weight) override;

  // Shapes with A = this rank's attention channels (C/T: its NH/T heads) and F = its MLP
  // width (4C/T); C, A, F, NH are the global ones on one rank. R = the rows of the norm and
  // residual regions: B*T, or B*T/T under sequence parallelism (this rank's block of them).
  struct BlockActs {  // one transformer block's saved activations
    void* ln1;        // (R,C)
    float* ln1_mean;  // (R)
    float* ln1_rstd;  // (R)
    void* qkv;        // (B,T,3A)
    void* atty;       // (B,T,A)
    float* lse;       // (B,NH/T,T)
    void* res2;       // (R,C) residual after attention
    void* ln2;        // (R,C)
    float* ln2_mean;  // (R)
    float* ln2_rstd;  // (R)
    void* fch;        // (B,T,F)
    void* fch_gelu;   // (B,T,F)
  };

  void run_to_logits(ParamSource& params) override;
  void stage_forward_impl(ParamSource& params, float dloss, bool hold) override;
  void stage_backward_impl(ParamSource& params, GradSink& grads, bool held) override;
  void select_saved(int k) override;
  void encoder(const int32_t* inputs, ParamSource& params);
  // The stage's blocks over res_[begin] -> res_[end].
  void forward_blocks(ParamSource& params);
  // The attention call's shape: this rank's heads, the micro-batch's document starts.
  AttentionShape attn_shape() const;
  void block_forward(int l, const void* w, const void* res_in, BlockActs& a, void* res_out);
  void block_backward(int l, const void* w, void* dw, const void* res_in, const BlockActs& a);
  // (Encoder,) blocks, final LayerNorm and logits (the last stage or the whole model). Leaves the
  // final-norm unit (returned) and the embedding unit (*wte_unit) acquired; the caller releases
  // both.
  const void* forward_to_logits(const int32_t* inputs, ParamSource& params, const void** wte_unit);
  BlockActs& acts_for(int l) { return checkpointing_ ? work_ : blocks_[static_cast<size_t>(l)]; }

  // The current slot's (select_saved): per layer of the stage (no checkpointing; other layers'
  // are empty), and the final norm's output and statistics (last stage).
  std::vector<BlockActs> blocks_;
  BlockActs work_{};  // recompute space (checkpointing)
  struct Saved {
    std::vector<BlockActs> blocks;
    void* lnf = nullptr;
    float* lnf_mean = nullptr;
    float* lnf_rstd = nullptr;
  };
  std::vector<Saved> saved_;  // per slot
  // The head's units acquired by stage_forward_impl with hold, for the backward.
  const void* held_wte_ = nullptr;
  const void* held_lnf_ = nullptr;
  // (B,T,C) attention/MLP projection before the residual add (and before its exchange); under
  // sequence parallelism also all B*T rows of the embedding, of a norm's output going into a
  // column-parallel matmul and of the gradient coming out of a row-parallel one.
  void* proj_tmp_;
  void* lnf_ = nullptr;  // (R,C)
  float* lnf_mean_ = nullptr;
  float* lnf_rstd_ = nullptr;
  void* d_a_;             // (B,T,F)
  void* d_b_;             // (B,T,3A)
  void* d_c_;             // (B,T,C)
  void* part_ = nullptr;  // sequence parallelism: (R,C) this rank's rows of a reduce-scatter
};

}  // namespace zerod
