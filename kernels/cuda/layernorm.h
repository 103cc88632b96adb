// Layer normalisation over the last dimension on the device (eps 1e-5, biased variance), fp32
// statistics and accumulation on compute-dtype storage. Device pointers; asynchronous on
// `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/storage.h"

namespace zerod::cuda {

// out (N,C) = (inp - mean) * rstd * weight + bias; mean (N) =, rstd (N) = 1/sqrt(var + eps).
void layernorm_forward(Storage dt, void* out, float* mean, float* rstd, const void* inp,
                       const void* weight, const void* bias, int64_t N, int C, cudaStream_t stream);

// res (N,C) = a + b rounded once to the storage type, then out, mean, rstd = the layernorm of
// res, in one kernel (a warp per row). res may be a or b.
void residual_layernorm_forward(Storage dt, void* res, void* out, float* mean, float* rstd,
                                const void* a, const void* b, const void* weight, const void* bias,
                                int64_t N, int C, cudaStream_t stream);

// Whether layernorm_backward computes dinp and the weight/bias gradient partials in one pass over
// dout and inp (rows of at most 3 16-byte packs a lane: C <= 768 in bf16/fp16, 384 in fp32) or
// in two (dinp, then per-channel partials). dinp is the same either way; the weight and bias
// gradients are summed in another (fixed) order. Starts as ZEROD_LAYERNORM_FUSED_GRADS (0 or 1;
// anything else is InputError naming the variable), else true; process-wide.
void set_layernorm_fused_gradients(bool on);
bool layernorm_fused_gradients();

// Bytes of device scratch layernorm_backward needs (fp32 partial sums of dweight and dbias).
size_t layernorm_backward_scratch_bytes(int64_t N, int C);

// dinp (N,C) +=, dweight (C) +=, dbias (C) += from dout (N,C). The weight/bias gradients are
// summed per fixed chunk of rows into `scratch`, then the chunks are added in order (no atomics,
// deterministic).
void layernorm_backward(Storage dt, void* dinp, void* dweight, void* dbias, const void* dout,
                        const void* inp, const void* weight, const float* mean, const float* rstd,
                        int64_t N, int C, float* scratch, cudaStream_t stream);

}  // namespace zerod::cuda
