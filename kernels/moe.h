// The options and results of a mixture-of-experts router, shared by every backend's MoE ops
// (kernels/backend.h; the CPU reference: kernels/cpu/moe_router.h, which says what each means
// and which reference each follows).
#pragma once

#include <cstdint>

namespace zerod {

// Which assignments an over-full expert keeps (DeepSpeed's orders, made total).
enum class MoeDropPolicy : uint8_t {
  // topkgating's drop_policy "probs" (its default): the largest router probabilities
  // probs[n, e]; equal probabilities keep the lower token.
  kProbs,
  // topkgating's drop_policy "position": token order, whichever of its k slots a token routed to
  // the expert with.
  kPosition,
  // top2gating's order: every token's first choice before any second choice (and so on for
  // larger k), each rank in token order. At k = 1 the same as kPosition.
  kChoiceRank,
};

// Which load-balancing loss the router reports and differentiates (kernels/cpu/moe_router.h).
enum class MoeAuxLoss : uint8_t {
  // Hugging Face's load_balancing_loss_func (Mixtral, Switch): E x sum_e f_e x P_e, f_e the
  // fraction of the N x k top-k slots (before dropping) that chose e.
  kHuggingFace,
  // DeepSpeed's gating l_aux: top1gating (k = 1) the same; top2gating (k = 2) f_e counts first
  // choices only; topkgating (k > 2) Hugging Face's divided by k.
  kDeepSpeed,
};

struct MoeRouterOptions {
  int num_experts = 0;  // E >= 1
  int top_k = 1;        // 1 <= k <= E
  // true: a token's weights are its kept top-k probabilities divided by their sum (Mixtral;
  // DeepSpeed top-2 / top-k, over the slots that survived dropping); false: the probabilities
  // themselves (Switch, DeepSpeed top-1).
  bool renormalize = true;
  // false: dropless (every assignment kept, no capacity).
  bool drop_tokens = false;
  double capacity_factor = 1.0;  // > 0 when drop_tokens
  int64_t min_capacity = 0;      // >= 0
  MoeDropPolicy drop_policy = MoeDropPolicy::kProbs;
  MoeAuxLoss aux_loss = MoeAuxLoss::kHuggingFace;
};

struct MoeRouterStats {
  double aux_loss = 0;    // moe_load_balancing_loss of this layer alone (T = N)
  double z_loss = 0;      // mean over tokens of lse^2 (0 when N == 0)
  int64_t capacity = -1;  // per expert; -1 when dropless
  int64_t dropped = 0;    // assignments dropped (of N * k)
};

// What the objective adds on top of the weights: aux_coef * aux + z_coef * z, where aux is the
// load-balancing loss over aux_tokens rows with per-expert counts aux_counts (E) (this layer
// alone: the forward's aux_counts and N, as DeepSpeed adds each layer's loss; Hugging Face's
// all-layer loss: the sums over layers and layers x N), and z is this layer's z-loss.
struct MoeRouterLossGrad {
  float aux_coef = 0;
  const int64_t* aux_counts = nullptr;  // (E); may be null when aux_coef == 0
  int64_t aux_tokens = 0;
  float z_coef = 0;
  // The rows the z-loss averages over (0: the call's N; context parallelism: the micro-batch's,
  // whose other rows other ranks hold).
  int64_t z_tokens = 0;
};

}  // namespace zerod
