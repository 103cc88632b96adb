// Softmax cross-entropy over the padded vocabulary on the device, fp32 math on compute-dtype
// logits. Device pointers (targets too); asynchronous on `stream`.
//
// The CPU reference throws on a target >= V; a device kernel cannot, so such a row gets a NaN
// loss (and NaN gradients in the fused op), which the caller's loss check then reports.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/storage.h"

namespace zerod::cuda {

// losses (N) = -log softmax(logits[n, :V])[targets[n]]; columns V..Vp-1 ignored; a target < 0
// gives loss 0.
void crossentropy_forward(Storage dt, float* losses, const void* logits, const int32_t* targets,
                          int64_t N, int V, int Vp, cudaStream_t stream);

// losses (N) = as above; logits (N,Vp) = dloss * (softmax - onehot(target)) on columns < V,
// 0 on the padding and on rows whose target is < 0.
void crossentropy_fused(Storage dt, float* losses, void* logits_to_dlogits, const int32_t* targets,
                        int64_t N, int V, int Vp, float dloss, cudaStream_t stream);

// ---- vocabulary-parallel cross-entropy (tensor parallelism; see kernels/backend.h) -----------
// logits (N,Vl) are the columns [v0, v0 + Vl) of the full logits, the first `real` of them real
// vocabulary; targets (N) global ids; stats (3N, fp32) = [max | target logit | sum of exp],
// combined over the shards by the caller between the steps. A target in this shard's padding
// (v0 + real <= target < v0 + Vl, i.e. >= the vocabulary size) makes step 1's target logit NaN
// (so the combined loss is NaN) and step 3's loss and dlogits row NaN, as crossentropy_fused
// does for a target >= V.

// Step 1: stats[n] = max over the real columns (-inf when real == 0), for every row;
// stats[N + n] = logits[n, target - v0] when v0 <= target < v0 + real, else 0.
void crossentropy_shard_stats(Storage dt, float* stats, const void* logits, const int32_t* targets,
                              int64_t N, int real, int Vl, int v0, cudaStream_t stream);

// Step 2: stats[2N + n] = sum over the real columns of e^(logits[n, j] - stats[n]).
void crossentropy_shard_sumexp(Storage dt, float* stats, const void* logits, int64_t N, int real,
                               int Vl, cudaStream_t stream);

// Step 3: losses (N) = log(sumexp) + (max - target logit), 0 where target < 0; logits (N,Vl) =
// dloss * (e^(x - max) / sumexp - onehot(target - v0)) on the real columns, 0 on the padding and
// on rows whose target < 0.
void crossentropy_shard_finish(Storage dt, float* losses, void* logits_to_dlogits,
                               const int32_t* targets, const float* stats, int64_t N, int real,
                               int Vl, int v0, float dloss, cudaStream_t stream);

}  // namespace zerod::cuda
