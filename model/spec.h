// The shape of a decoder-only transformer: GPT-2 or a Llama-family model (Llama 2/3, Mistral,
// Qwen2). One struct for every architecture; the fields that an architecture does not use keep
// their defaults (GPT-2: no KV heads, no RoPE; Llama: no learned positions).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/moe_spec.h"

namespace zerod {

enum class ModelArch : uint8_t {
  kGpt2,     // learned positions, pre-LayerNorm, GELU MLP 4x, biases, tied embedding
  kLlama,    // RMSNorm, RoPE, SwiGLU, grouped-query attention, no biases (by default)
  kMistral,  // Llama + sliding-window attention
  kQwen2,    // Llama + q/k/v biases (+ optional sliding window)
  kMixtral,  // Llama whose MLPs are sparse experts (moe: SwiGLU experts w1, w3, w2)
};
// "gpt2", "llama", "mistral", "qwen2", "mixtral"
const char* model_arch_name(ModelArch a);

// Rotary-embedding frequency scaling (Hugging Face `rope_scaling` / `rope_parameters`).
// dynamic and yarn are computed as transformers 4.57 does (modeling_rope_utils.py).
struct RopeScaling {
  enum class Type : uint8_t { kNone, kLinear, kLlama3, kDynamic, kYarn };
  Type type = Type::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  // llama3 (required there); yarn: the pretraining length whose rotations set the ramp
  // (0: max_position_embeddings).
  int original_max_position_embeddings = 0;
  // dynamic: the length past which the base grows; yarn: the ramp's length when
  // original_max_position_embeddings is 0. 0 elsewhere (config.json's value is not needed).
  int max_position_embeddings = 0;
  double attention_factor = 0.0;  // yarn: cos and sin are scaled by it (0: 0.1 ln(factor) + 1)
  double beta_fast = 32.0;        // yarn: rotations bounding the extrapolated channels
  double beta_slow = 1.0;         // yarn: rotations bounding the interpolated channels

  bool operator==(const RopeScaling&) const = default;
};
// "none", "linear", "llama3", "dynamic", "yarn" (Hugging Face's rope_type; "none" is "default").
inline const char* rope_scaling_name(RopeScaling::Type t) {
  switch (t) {
    case RopeScaling::Type::kNone:
      return "none";
    case RopeScaling::Type::kLinear:
      return "linear";
    case RopeScaling::Type::kLlama3:
      return "llama3";
    case RopeScaling::Type::kDynamic:
      return "dynamic";
    case RopeScaling::Type::kYarn:
      return "yarn";
  }
  return "?";
}

struct ModelSpec {
  ModelArch arch = ModelArch::kGpt2;
  int n_layer = 12;
  int n_head = 12;
  int n_embd = 768;           // C (hidden_size)
  int vocab_size = 50257;     // V: the real vocabulary, the loss covers these columns
  int padded_vocab_size = 0;  // Vp: V rounded up to a multiple of 128 (0: derive)
  int seq_len = 1024;         // max T (GPT-2: rows of the position embedding)
  double init_std = 0.02;     // N(0, init_std) for weights (HF initializer_range)

  // Llama family (ignored for GPT-2).
  int n_kv_head = 0;          // KVH (num_key_value_heads); 0: n_head
  int head_dim = 0;           // HS when set; 0: n_embd / n_head
  int intermediate_size = 0;  // I of the MLP; 0: 4 C (GPT-2's)
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling{};
  bool tie_word_embeddings = true;  // GPT-2 always; Llama: lm_head.weight shares embed_tokens
  bool qkv_bias = false;            // biases on q/k/v (Qwen2; Llama's attention_bias)
  bool o_bias = false;              // bias on o_proj (Llama's attention_bias)
  bool mlp_bias = false;            // biases on gate/up/down (Llama's mlp_bias)
  int sliding_window = 0;           // 0: full causal; W: attend to the last W positions
  // Per layer, 1 where sliding_window applies (Qwen2's per-layer window); empty: every layer.
  std::vector<uint8_t> sliding_layers;

  // Mixture of experts (Mixtral, or a moe section on GPT-2 / Llama): which blocks' MLPs are
  // experts of ffn() channels each (model/moe_spec.h); none by default.
  MoeSpec moe{};

  bool llama_family() const { return arch != ModelArch::kGpt2; }
  int kv_heads() const { return llama_family() && n_kv_head > 0 ? n_kv_head : n_head; }
  int head_size() const { return llama_family() && head_dim > 0 ? head_dim : n_embd / n_head; }
  int ffn() const { return intermediate_size > 0 ? intermediate_size : 4 * n_embd; }
  // The window of block l (0: full causal).
  int window_of(int l) const {
    const bool windowed =
        sliding_layers.empty() || (l >= 0 && static_cast<size_t>(l) < sliding_layers.size() &&
                                   sliding_layers[static_cast<size_t>(l)] != 0);
    return windowed ? sliding_window : 0;
  }
  int q_dim() const { return n_head * head_size(); }       // channels of q (and of attention out)
  int kv_dim() const { return kv_heads() * head_size(); }  // channels of k (and of v)
  int qkv_dim() const { return q_dim() + 2 * kv_dim(); }
  int vp() const {
    return padded_vocab_size > 0 ? padded_vocab_size : (vocab_size + 127) / 128 * 128;
  }
  bool tied() const { return !llama_family() || tie_word_embeddings; }

  // Real parameters (as Hugging Face counts them: vocab and positions unpadded).
  int64_t num_parameters() const;
  // Parameters as stored (vocabulary padded to Vp): what the matmuls actually multiply.
  int64_t num_parameters_padded() const;
  // Training FLOPs per token (forward + backward) at sequence length T, llm.c's convention:
  // 6 * matmul parameters (padded; GPT-2 counts every parameter as llm.c does) + 6 * n_layer *
  // T * q_dim for attention (QK^T and PV forward and backward, halved for the causal mask).
  // The CPU benchmark shape gives 98.2 MFLOP/token.
  double flops_per_token(int T) const;
};

// Mixture of experts (0 for a dense spec): the parameters of one MoE block's MLP (router, every
// expert, the shared experts), and the routed experts' parameters in the whole model.
int64_t moe_mlp_parameters(const ModelSpec& s);
int64_t moe_expert_parameters(const ModelSpec& s);
// One line on a MoE spec's experts for `zerod check` and the start of a job: its MoE blocks,
// experts, routing and parameters ("" for a dense spec), e.g. "mixture of experts: blocks
// 0,1,...,31 (32 of 32), 8 experts x 176.2M parameters + router, top-2 renormalised, dropless, aux
// loss 0.02 x (Hugging Face, all layers): experts 45.1B of 46.7B parameters, 12.9B active per
// token".
std::string describe_moe(const ModelSpec& s);

}  // namespace zerod
