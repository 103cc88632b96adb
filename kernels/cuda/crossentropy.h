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

}  // namespace zerod::cuda
