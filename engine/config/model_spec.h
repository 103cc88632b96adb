// The model shape of a job (ModelConfig) as the model code takes it (ModelSpec). Header-only, so
// that engine/config itself does not depend on model/.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>

#include "engine/config/job_config.h"
#include "model/spec.h"

namespace zerod {

// Mixtral: dropless, renormalised top-k, Hugging Face's all-layer aux loss (in the objective
// only with output_router_logits), no z-loss. A moe section: DeepSpeed-MoE's gating (top-1 not
// renormalised, top-2 by choice rank, top-k by probability; each layer's own l_aux).
inline MoeSpec moe_spec(const ModelConfig& m) {
  const MoeConfig& e = m.moe;
  MoeSpec o;
  if (e.num_experts == 0) return o;
  o.num_experts = e.num_experts;
  o.top_k = e.top_k;
  if (m.type == "mixtral") {
    o.renormalize = true;
    o.drop_tokens = false;
    o.aux_loss = MoeAuxLoss::kHuggingFace;
    o.aux_loss_coef = e.output_router_logits ? e.aux_loss_coef : 0.0;
    return o;
  }
  o.layer_frequency = e.moe_layer_frequency;
  o.renormalize = e.top_k >= 2;
  o.drop_tokens = e.drop_tokens;
  o.capacity_factor = e.capacity_factor;
  o.eval_capacity_factor = e.eval_capacity_factor;
  o.min_capacity = e.min_capacity;
  o.drop_policy = e.top_k <= 2 ? MoeDropPolicy::kChoiceRank : MoeDropPolicy::kProbs;
  o.aux_loss = MoeAuxLoss::kDeepSpeed;
  o.aux_loss_coef = e.aux_loss_coef;
  o.z_loss_coef = e.router_z_loss_coef;
  o.shared_experts = e.shared_experts;
  return o;
}

inline ModelSpec model_spec(const ModelConfig& m) {
  ModelSpec s;
  s.arch = m.type == "llama"     ? ModelArch::kLlama
           : m.type == "mistral" ? ModelArch::kMistral
           : m.type == "qwen2"   ? ModelArch::kQwen2
           : m.type == "mixtral" ? ModelArch::kMixtral
                                 : ModelArch::kGpt2;
  s.n_layer = m.n_layer;
  s.n_head = m.n_head;
  s.n_embd = m.n_embd;
  s.vocab_size = m.vocab_size;
  s.padded_vocab_size = m.padded_vocab_size;
  s.seq_len = m.seq_len;
  s.init_std = m.init_std;
  s.moe = moe_spec(m);
  if (!s.llama_family()) return s;
  s.n_kv_head = m.n_kv_head;
  s.head_dim = m.head_dim;
  s.intermediate_size = m.intermediate_size;
  s.rms_norm_eps = m.rms_norm_eps;
  s.rope_theta = m.rope_theta;
  if (m.rope_type == "linear") {
    s.rope_scaling.type = RopeScaling::Type::kLinear;
  } else if (m.rope_type == "llama3") {
    s.rope_scaling.type = RopeScaling::Type::kLlama3;
  } else if (m.rope_type == "dynamic") {
    s.rope_scaling.type = RopeScaling::Type::kDynamic;
  } else if (m.rope_type == "yarn") {
    s.rope_scaling.type = RopeScaling::Type::kYarn;
  }
  s.rope_scaling.factor = m.rope_factor;
  s.rope_scaling.low_freq_factor = m.rope_low_freq_factor;
  s.rope_scaling.high_freq_factor = m.rope_high_freq_factor;
  s.rope_scaling.original_max_position_embeddings = m.rope_original_max_position_embeddings;
  s.rope_scaling.max_position_embeddings = m.max_position_embeddings;
  s.rope_scaling.attention_factor = m.rope_attention_factor;
  s.rope_scaling.beta_fast = m.rope_beta_fast;
  s.rope_scaling.beta_slow = m.rope_beta_slow;
  s.tie_word_embeddings = m.tie_word_embeddings;
  s.qkv_bias = m.type == "qwen2" || m.attention_bias;
  s.o_bias = m.type == "llama" && m.attention_bias;
  s.mlp_bias = m.mlp_bias;
  s.sliding_window = m.sliding_window;
  if (m.type == "qwen2") {
    // transformers 4.57: no window without use_sliding_window; with it, the layers layer_types
    // names, else those from max_window_layers on.
    if (!m.use_sliding_window) s.sliding_window = 0;
    if (s.sliding_window > 0) {
      s.sliding_layers.assign(static_cast<size_t>(m.n_layer), 0);
      for (int l = 0; l < m.n_layer; ++l) {
        const bool windowed = m.layer_types.empty()
                                  ? l >= m.max_window_layers
                                  : (static_cast<size_t>(l) < m.layer_types.size() &&
                                     m.layer_types[static_cast<size_t>(l)] == "sliding_attention");
        s.sliding_layers[static_cast<size_t>(l)] = windowed ? 1 : 0;
      }
      const auto n = std::count(s.sliding_layers.begin(), s.sliding_layers.end(), uint8_t{1});
      if (n == 0) s.sliding_window = 0;
      if (n == 0 || n == m.n_layer) s.sliding_layers.clear();  // one rule for every layer
    }
  }
  return s;
}

// rope_scaling as Hugging Face's config.json spells it (null without scaling): what zerod reads
// back as the same RopeScaling (job_to_json, config.json of an export).
inline nlohmann::ordered_json rope_scaling_json(const RopeScaling& r) {
  using Type = RopeScaling::Type;
  if (r.type == Type::kNone) return nullptr;
  nlohmann::ordered_json j = {{"rope_type", rope_scaling_name(r.type)}, {"factor", r.factor}};
  if (r.type == Type::kLlama3) {
    j["low_freq_factor"] = r.low_freq_factor;
    j["high_freq_factor"] = r.high_freq_factor;
    j["original_max_position_embeddings"] = r.original_max_position_embeddings;
  } else if (r.type == Type::kYarn) {
    j["beta_fast"] = r.beta_fast;
    j["beta_slow"] = r.beta_slow;
    if (r.attention_factor > 0) j["attention_factor"] = r.attention_factor;
    if (r.original_max_position_embeddings > 0) {
      j["original_max_position_embeddings"] = r.original_max_position_embeddings;
    }
  }
  return j;
}

}  // namespace zerod
