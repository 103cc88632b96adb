// Softmax cross-entropy over a padded vocabulary, fp32 logits.
#pragma once

#include <cstdint>

#include "core/dtype.h"

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
// round_to bf16/fp16 (the CPU backend's 16-bit modes, which keep 16-bit values in fp32 storage):
// each row is rounded to that type before it is read and its dlogits after they are written,
// while the row is in cache, bit for bit what rounding the whole (N,Vp) array before and after
// would give without the two extra passes over memory.
// dlogits_bf16 (N,Vp), when not null (round_to must then be bf16): each row's dlogits also as
// bf16 bits, written from the same cached row (the bf16 products of the head's backward take
// them instead of converting the fp32 dlogits again).
void crossentropy_fused(float* losses, float* logits_to_dlogits, const int32_t* targets, int64_t N,
                        int V, int Vp, float dloss, DType round_to = DType::kF32,
                        uint16_t* dlogits_bf16 = nullptr);

// ---- vocabulary-parallel cross-entropy (tensor parallelism) ----------------------------------
// This rank holds the columns [v0, v0 + Vl) of every row of the full logits: logits (N,Vl), of
// which the first `real` (0 <= real <= Vl) are real vocabulary and the rest padding (ignored).
// targets (N) are global ids (< 0: no loss). stats (3N) = [max | target logit | sum of exp].
// The caller combines the statistics over the shards between the steps (max of [0,N), sums of
// [N,2N) and [2N,3N)). All three throw when a target falls in this shard's padding
// (v0 + real <= target < v0 + Vl: it is >= the vocabulary size).

// Step 1: stats[n] = max over the real columns of row n (-inf when real == 0), computed for every
// row (step 2 has no targets); stats[N + n] = logits[n, target - v0] when v0 <= target <
// v0 + real, else 0.
void crossentropy_shard_stats(float* stats, const float* logits, const int32_t* targets, int64_t N,
                              int real, int Vl, int v0);

// Step 2, with stats[0,N) the combined max: stats[2N + n] = sum over the real columns of
// e^(logits[n, j] - stats[n]).
void crossentropy_shard_sumexp(float* stats, const float* logits, int64_t N, int real, int Vl);

// Step 3, with all statistics combined (m = stats[n], xt = stats[N + n], s = stats[2N + n]):
// losses[n] = log(s) + (m - xt) (0 where target < 0); logits (N,Vl) overwritten by
// dlogits = dloss * (e^(x - m) / s - onehot(target - v0)) on the real columns, 0 on the padding
// and on rows whose target < 0. The same arithmetic as crossentropy_fused per element, so the
// shards' results differ from it only through the summation order of s.
void crossentropy_shard_finish(float* losses, float* logits_to_dlogits, const int32_t* targets,
                               const float* stats, int64_t N, int real, int Vl, int v0,
                               float dloss);

}  // namespace zerod::cpu
