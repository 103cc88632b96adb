// The mixture-of-experts shape of a model (ModelSpec::moe): which blocks have experts instead of
// a dense MLP and how their router behaves. Mixtral (model.type "mixtral", Hugging Face's
// MixtralConfig) and a "moe" section on GPT-2 or the Llama family (DeepSpeed-MoE's names) both
// fill it (engine/config/model_section.cc). num_experts == 0: a dense model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/moe.h"

namespace zerod {

struct MoeSpec {
  int num_experts = 0;  // E (num_local_experts); 0: no experts
  int top_k = 1;        // k (num_experts_per_tok)
  // Every layer_frequency-th block is a MoE block: block l when l % layer_frequency == 0
  // (Megatron-core's moe_layer_freq = k; 1: every block).
  int layer_frequency = 1;
  bool renormalize = true;   // the top-k weights divided by their sum (Mixtral; DeepSpeed k >= 2)
  bool drop_tokens = false;  // false: dropless
  double capacity_factor = 1.0;       // training (forward_backward)
  double eval_capacity_factor = 1.0;  // evaluation and generation (forward)
  int64_t min_capacity = 4;
  MoeDropPolicy drop_policy = MoeDropPolicy::kProbs;
  // kHuggingFace: one load-balancing loss over every MoE layer's router logits concatenated
  // (Mixtral's load_balancing_loss_func over all layers); kDeepSpeed: each layer's own l_aux,
  // summed over the layers.
  MoeAuxLoss aux_loss = MoeAuxLoss::kHuggingFace;
  double aux_loss_coef = 0.0;  // added to the objective: aux_loss_coef x aux
  double z_loss_coef = 0.0;    // router_z_loss_coef x z (ST-MoE), summed over the layers
  // DeepSeek-style always-on experts: one dense MLP of shared_experts x the expert width beside
  // the routed experts (0: none).
  int shared_experts = 0;

  bool enabled() const { return num_experts > 0; }
  bool is_moe_layer(int l) const { return enabled() && l % layer_frequency == 0; }
  int moe_layers(int n_layer) const {
    int n = 0;
    for (int l = 0; l < n_layer; ++l) n += is_moe_layer(l) ? 1 : 0;
    return n;
  }
  // The router options of a forward: training or evaluation capacity.
  MoeRouterOptions router(bool training) const {
    MoeRouterOptions o;
    o.num_experts = num_experts;
    o.top_k = top_k;
    o.renormalize = renormalize;
    o.drop_tokens = drop_tokens;
    o.capacity_factor = training ? capacity_factor : eval_capacity_factor;
    o.min_capacity = min_capacity;
    o.drop_policy = drop_policy;
    o.aux_loss = aux_loss;
    return o;
  }
  bool operator==(const MoeSpec&) const = default;
};

// What the MoE layers of the last forward_backward (or forward) routed, per MoE layer, and the
// losses they added to the objective.
struct MoeStepStats {
  int tokens = 0;                          // N rows per layer
  std::vector<int> layers;                 // the model's MoE layers, in order
  std::vector<std::vector<int64_t>> kept;  // per layer: rows each expert computed (E)
  std::vector<int64_t> dropped;            // per layer: assignments dropped (of N k)
  std::vector<double> layer_aux, layer_z;  // per layer: its own aux loss (T = N) and z-loss
  double aux_loss = 0;                     // the load-balancing loss (unscaled)
  double z_loss = 0;                       // sum over the layers of each one's z-loss
  double objective = 0;                    // aux_loss_coef x aux_loss + z_loss_coef x z_loss
};

}  // namespace zerod
