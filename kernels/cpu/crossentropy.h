// Softmax cross-entropy over a padded vocabulary, fp32 logits.
#pragma once

#include <cstdint>

namespace zerod::cpu {

// losses (N) = -log softmax(logits[n, :V])[targets[n]] from logits (N,Vp); columns V..Vp-1 are
// ignored; targets[n] < 0 gives losses[n] = 0. Log-softmax is computed stably (row max first).
// Throws when a target is >= V.
void crossentropy_forward(float* losses, const float* logits, const int32_t* targets, int64_t N,
                          int V, int Vp);

// Fused forward + backward: losses (N) = as above; logits (N,Vp) is overwritten by
// dlogits = dloss * (softmax - onehot(target)) on columns < V and 0 on columns >= V; rows with
// target < 0 become all zero. Per row: one pass for the max, then (with the row resident in
// L2) one pass writing e^(x - max) and summing, one pass scaling to dlogits.
void crossentropy_fused(float* losses, float* logits_to_dlogits, const int32_t* targets, int64_t N,
                        int V, int Vp, float dloss);

}  // namespace zerod::cpu
