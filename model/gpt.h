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
#include "model/param_source.h"

namespace zerod {

// Seconds spent per kind of op (accumulated while enabled).
struct OpTimes {
  double encoder = 0, layernorm = 0, matmul_fwd = 0, matmul_bwd = 0, attention_fwd = 0,
         attention_bwd = 0, gelu = 0, residual = 0, classifier = 0, rounding = 0;
  // Phases of forward_backward: forward (through the loss) and backward, each without the
  // time spent inside the ParamSource/GradSink (ZeRO gathers and reductions), which is zero_wait.
  double forward = 0, backward = 0, zero_wait = 0;
  double total() const;  // the ops above
};

class Gpt {
 public:
  // The bytes the constructor allocates for activations (MemCategory::kActivations) for a
  // micro-batch of B x T, compute elements of esz bytes (statistics are fp32).
  static int64_t activation_bytes(const GptSpec& spec, int B, int T, bool activation_checkpointing,
                                  size_t esz);

  Gpt(const GptSpec& spec, Backend& backend, int B, int T, bool activation_checkpointing,
      MemoryTracker* tracker);

  const ParamLayout& layout() const { return layout_; }
  const GptSpec& spec() const { return layout_.spec(); }
  int batch() const { return B_; }
  int seq() const { return T_; }

  // Mean cross-entropy over the positions whose target is >= 0 (evaluation; no gradients).
  // inputs, targets (B,T), tokens in [0, V), in host memory (copied to the backend's memory).
  float forward(const int32_t* inputs, const int32_t* targets, ParamSource& params);

  // Forward and backward of one micro-batch. Returns the mean loss. The gradient of
  // loss_weight * mean_loss is accumulated (+=) into the GradSink's buffers (loss_weight folds
  // in the loss scale and 1/gradient_accumulation_steps).
  float forward_backward(const int32_t* inputs, const int32_t* targets, ParamSource& params,
                         GradSink& grads, float loss_weight);

  void set_timing(bool on) { timing_ = on; }
  const OpTimes& times() const { return times_; }
  void reset_times() { times_ = OpTimes{}; }

 private:
  struct BlockActs {  // one transformer block's saved activations
    void* ln1;        // (B,T,C)
    float* ln1_mean;  // (B,T)
    float* ln1_rstd;  // (B,T)
    void* qkv;        // (B,T,3C)
    void* atty;       // (B,T,C)
    float* lse;       // (B,NH,T)
    void* res2;       // (B,T,C) residual after attention
    void* ln2;        // (B,T,C)
    float* ln2_mean;  // (B,T)
    float* ln2_rstd;  // (B,T)
    void* fch;        // (B,T,4C)
    void* fch_gelu;   // (B,T,4C)
  };

  float forward_backward_impl(const int32_t* inputs, const int32_t* targets, ParamSource& params,
                              GradSink& grads, float loss_weight);
  void encoder(const int32_t* inputs, ParamSource& params);
  void block_forward(int l, const void* w, const void* res_in, BlockActs& a, void* res_out);
  void block_backward(int l, const void* w, void* dw, const void* res_in, const BlockActs& a);
  // Encoder, blocks, final LayerNorm and logits. Leaves the final-norm unit (returned) and the
  // embedding unit (*wte_unit) acquired; the caller releases both.
  const void* forward_to_logits(const int32_t* inputs, ParamSource& params, const void** wte_unit);
  // Mean of the losses of the positions whose target is >= 0 (read back from the backend).
  float mean_loss(const int32_t* targets);
  // inputs and targets (host) into tokens_ and targets_ (the backend's memory).
  void upload(const int32_t* inputs, const int32_t* targets);
  void round(void* x, int64_t n);
  Backend* timer() { return timing_ ? &be_ : nullptr; }  // for timed() in gpt.cc
  void* act(size_t elems);
  float* stat(size_t elems);
  BlockActs& acts_for(int l) { return checkpointing_ ? work_ : blocks_[static_cast<size_t>(l)]; }

  ParamLayout layout_;
  Backend& be_;
  int B_, T_;
  bool checkpointing_;
  bool rounding_;  // compute dtype != fp32 and the backend stores fp32 (emulation)
  size_t esz_;
  MemoryTracker* tracker_;

  std::vector<Buffer> buffers_;
  std::vector<BlockActs> blocks_;  // per layer (no checkpointing)
  BlockActs work_{};               // recompute space (checkpointing)
  std::vector<void*> res_;  // (L+1) x (B,T,C): res_[0] = encoder out, res_[l+1] = block l out
  void* proj_tmp_;          // (B,T,C) attention/MLP projection before the residual add
  void* lnf_;               // (B,T,C)
  float* lnf_mean_;
  float* lnf_rstd_;
  void* logits_;                    // (B,T,Vp), becomes dlogits in backward
  float* losses_;                   // (B,T)
  int32_t* tokens_;                 // (B,T) the inputs, in the backend's memory
  int32_t* targets_;                // (B,T)
  std::vector<float> host_losses_;  // (B,T)
  void* dres_;                      // (B,T,C) gradient of the residual stream
  void* d_a_;                       // (B,T,4C)
  void* d_b_;                       // (B,T,3C)
  void* d_c_;                       // (B,T,C)

  bool timing_ = false;
  OpTimes times_;
  // While a timed forward_backward runs: its clock, its seam time, and both at the loss.
  const Stopwatch* phase_clock_ = nullptr;
  const double* phase_seam_ = nullptr;
  double forward_wall_ = 0, forward_seam_ = 0;
};

}  // namespace zerod
