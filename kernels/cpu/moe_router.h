// Mixture-of-experts router over a layer's router logits (N tokens x E experts), fp32: softmax
// top-k gating, the load-balancing auxiliary loss, the router z-loss, and capacity with token
// dropping or the dropless mode; and the backward of all of it to the logits.
//
// References (formulas, not code):
//   - Hugging Face transformers, Mixtral (MixtralSparseMoeBlock, load_balancing_loss_func):
//     probs = softmax(logits); the k most probable experts per token; their weights renormalised
//     to sum to 1; aux = E * sum_e f_e * P_e with f_e = (top-k assignments to e) / N (each of a
//     token's k slots counts, so sum_e f_e = k) and P_e = mean over tokens of probs[:, e]; the
//     loss's gradient flows through P only (the assignment counts are constants).
//   - ST-MoE's router z-loss: z = mean over tokens of logsumexp(logits[n, :])^2.
//   - DeepSpeed (deepspeed/moe/sharded_moe.py, top1gating / top2gating / topkgating): capacity =
//     max(ceil(N / E * capacity_factor * k), min_capacity) in DeepSpeed's fp32 arithmetic; an
//     expert keeps at most `capacity` of the assignments routed to it, in one of the orders of
//     MoeDropPolicy; the combine weights are the softmax probabilities of the KEPT slots,
//     renormalised over them (top-2 / top-k; clamped below at FLT_EPSILON) or not (top-1).
//     With MoeAuxLoss::kDeepSpeed the aux loss is its gatings' l_aux: top1gating's equals the
//     above at k = 1, top2gating's counts first choices only, topkgating's is the above / k.
//
// Determinism: the top-k is chosen on the logits (the softmax is monotonic, so this is the top-k
// of the probabilities without depending on how exp rounds), most probable first, and on equal
// logits the lower expert index wins. Every drop order is total (ties go to the lower token),
// unlike DeepSpeed's, which samples (top-1's random token selection, top-2's Gumbel second
// choice) or leaves ties to torch.topk. Results do not depend on the thread count.
//
// Across layers: Hugging Face's Mixtral computes ONE aux loss over the logits of all layers
// concatenated (T = layers x N rows); moe_load_balancing_loss takes the summed counts and
// probability sums for that, and moe_router_backward takes the counts and T the loss was
// computed from. DeepSpeed adds the layers' losses (each layer's own counts and N).
#pragma once

#include <cstdint>

#include "kernels/moe.h"

namespace zerod::cpu {

// Throws InputError naming the bad field (E < 1, k outside [1, E], capacity_factor <= 0 with
// drop_tokens, min_capacity < 0).
void validate(const MoeRouterOptions& o);

// DeepSpeed's _capacity for N tokens: max(ceil(fp32(N / E) * fp32(capacity_factor * k)),
// min_capacity), the product rounded to fp32 as torch computes it.
int64_t moe_capacity(int64_t N, const MoeRouterOptions& o);

// The load-balancing loss from per-expert sums over T rows: scale * E * sum_e (aux_counts[e] / T)
// * (prob_sum[e] / T), scale = 1 / k for DeepSpeed's topkgating (o.aux_loss kDeepSpeed, k > 2),
// else 1. aux_counts (E): the forward's; prob_sum (E): sum over the rows of probs[:, e]. 0 when
// T == 0.
double moe_load_balancing_loss(const int64_t* aux_counts, const double* prob_sum, int64_t T,
                               const MoeRouterOptions& o);

// Forward over logits (N,E):
//   probs (N,E) =    softmax of each row
//   lse (N) =        logsumexp of each row (the z-loss's, kept for backward)
//   expert (N,k) =   int32, each token's top-k experts, most probable first; -1 where the
//                    assignment was dropped (its weight is 0)
//   weight (N,k) =   the combine weights (0 where dropped)
//   aux_counts (E) = the aux loss's assignments per expert, before dropping: every top-k slot
//                    (Hugging Face; DeepSpeed at k != 2), first choices only (DeepSpeed, k = 2)
//   kept (E) =       assignments per expert after dropping (the rows each expert computes)
//   prob_sum (E) =   sum over tokens of probs[:, e], in double (may be null)
// N == 0 is allowed (everything empty, losses 0).
MoeRouterStats moe_router_forward(float* probs, float* lse, int32_t* expert, float* weight,
                                  int64_t* aux_counts, int64_t* kept, double* prob_sum,
                                  const float* logits, int64_t N, const MoeRouterOptions& o);

// dlogits (N,E) = the gradient of sum(dweight * weight) + aux_coef * aux + z_coef * z with
// respect to logits, from the forward's probs, lse and expert. dweight (N,k) may be null (no
// weight gradient); its entries at dropped slots are ignored.
void moe_router_backward(float* dlogits, const float* dweight, const float* probs, const float* lse,
                         const int32_t* expert, int64_t N, const MoeRouterOptions& o,
                         const MoeRouterLossGrad& loss);

}  // namespace zerod::cpu
