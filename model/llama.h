// A Llama-family transformer (Llama 2/3, Mistral, Qwen2) over a Backend, computing what Hugging
// Face's LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM compute: token embedding (no
// learned positions), pre-RMSNorm blocks with rotary-embedded grouped-query attention (sliding
// window for Mistral) and a SwiGLU MLP, a final RMSNorm and an output head that is the embedding
// (tied) or lm_head.weight; vocabulary padded to Vp (the loss covers the real V). Weights come
// from a ParamSource, gradients go to a GradSink, unit by unit; the model knows no peers.
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
#include "model/model_base.h"

namespace zerod {

// The rotary tables of a spec: cos, sin (seq_len, HS/2) in fp32, computed as Hugging Face
// computes them in fp32 (inv_freq = 1 / theta^(2i/HS), then the rope_scaling of the spec, then
// angle = float(position) * inv_freq; yarn scales both tables by its attention factor).
// rope dynamic takes the sequence length to be the spec's seq_len.
void rope_tables(const ModelSpec& spec, std::vector<float>* cos, std::vector<float>* sin);
// What yarn multiplies cos and sin by (attention_factor, else 0.1 ln(factor) + 1); 1 elsewhere.
double rope_attention_factor(const RopeScaling& r);

class Llama final : public ModelBase {
 public:
  // Activation bytes on a rank of `shard` (its local dimensions and, under sequence
  // parallelism, its rows).
  // Context-parallel: of a context group of `context` ranks (T/context rows per sequence).
  static int64_t activation_bytes(const ModelSpec& spec, const TensorShard& shard, int B, int T,
                                  bool activation_checkpointing, size_t esz, int context = 1,
                                  LayerRange stage = {}, int slots = 1);

  // Tensor-parallel (shard.size > 1): this rank's heads, KV heads, MLP width and vocabulary rows
  // (model/shard.h); the shapes below are then the local ones (NH, Q, QKV, I divided by T).
  // Sequence-parallel: the norm and residual buffers hold R = N/T rows (this rank's block).
  // Context-parallel (context.size = C > 1): the T/C positions of each sequence context rank
  // context.rank holds (the shapes below have T/C for T), rotated by their global positions.
  // A pipeline stage (stage: its layers) holds `slots` micro-batches' activations.
  Llama(const ModelSpec& spec, Backend& backend, int B, int T, bool activation_checkpointing,
        MemoryTracker* tracker, TensorShard shard = {}, ContextShard context = {},
        LayerRange stage = {}, int slots = 1);

 private:
  float forward_backward_impl(const int32_t* inputs, const int32_t* targets, ParamSource& params,
                              GradSink& grads, float loss_weight) override;

  struct BlockActs {  // one block's saved activations (N = B*T rows; R = N or N/T, above)
    void* ln1;        // (R,C)
    float* ln1_rstd;  // (R)
    void* qkv;        // (N,QKV) q and k rotated
    void* atty;       // (N,Q)
    float* lse;       // (B,NH,T)
    void* res2;       // (R,C) residual after attention
    void* ln2;        // (R,C)
    float* ln2_rstd;  // (R)
    void* gu;         // (N,2I) gate | up (null in a MoE block: model/moe_block.h)
    void* act;        // (N,I) silu(gate) * up
  };

  void run_to_logits(ParamSource& params) override;
  void stage_forward_impl(ParamSource& params, float dloss, bool hold) override;
  void stage_backward_impl(ParamSource& params, GradSink& grads, bool held) override;
  void select_saved(int k) override;
  void embed(const int32_t* tokens, ParamSource& params);  // tokens -> res_[0]
  void forward_blocks(ParamSource& params);                // res_[begin] -> res_[end]
  void block_forward(int l, const void* w, const void* res_in, BlockActs& a, void* res_out);
  void block_backward(int l, const void* w, void* dw, const void* res_in, const BlockActs& a);
  // (Embedding,) blocks, final norm and logits (the last stage or the whole model). Leaves the
  // final unit acquired (returned) and, when the head is tied, the embedding unit (*emb_unit, else
  // null); the caller releases them.
  const void* forward_to_logits(const int32_t* tokens, ParamSource& params, const void** emb_unit);
  AttentionShape attn_shape(int l) const;  // block l's (its window: ModelSpec::window_of)
  BlockActs& acts_for(int l) { return checkpointing_ ? work_ : blocks_[static_cast<size_t>(l)]; }

  // The current slot's (select_saved): per layer of the stage (no checkpointing; other layers'
  // are empty), and the final norm's output and statistics (last stage).
  std::vector<BlockActs> blocks_;
  BlockActs work_{};  // recompute space (checkpointing)
  struct Saved {
    std::vector<BlockActs> blocks;
    void* lnf = nullptr;
    float* lnf_rstd = nullptr;
  };
  std::vector<Saved> saved_;  // per slot
  // The head's units acquired by stage_forward_impl with hold, for the backward.
  const void* held_emb_ = nullptr;
  const void* held_final_ = nullptr;
  // (N,C) attention/MLP projection before the residual add (and before its exchange); under
  // sequence parallelism also all N rows of the embedding, of a norm's output going into a
  // column-parallel matmul and of the gradient coming out of a row-parallel one.
  void* proj_tmp_;
  void* lnf_ = nullptr;        // (R,C)
  float* lnf_rstd_ = nullptr;  // (R)
  float* rope_cos_;  // (seq_len, HS/2) in the backend's memory
  float* rope_sin_;  // (seq_len, HS/2)
  // Context-parallel: the rows of the tables at this rank's positions (T/C, HS/2); else null.
  float* rows_cos_ = nullptr;
  float* rows_sin_ = nullptr;
  void* d_a_;             // (N, max(2I, QKV))
  void* d_b_;             // (N, max(I, Q))
  void* d_c_;             // (N,C)
  void* part_ = nullptr;  // sequence parallelism: (R,C) this rank's rows of a reduce-scatter
};

}  // namespace zerod
