// Fused causal multi-head self-attention on the device (flash-attention style): the T x T score
// matrix is never stored; scores, softmax and products are computed per 32 x 32 tile in shared
// memory with fp32 accumulation. Layouts as kernels/cpu/attention.h: qkv (B,T,3C) with q, k, v
// at channels [0,C), [C,2C), [2C,3C), head h at [h*hs, (h+1)*hs), hs = C/NH, scale 1/sqrt(hs).
// Device pointers; asynchronous on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/storage.h"

namespace zerod::cuda {

// The largest head size the kernels support (a lane holds up to 8 channels of a row).
constexpr int kAttentionMaxHeadSize = 256;

// out (B,T,C) =; lse (B,NH,T) = log-sum-exp of each scaled, masked score row (fp32).
// 1 <= C/NH <= kAttentionMaxHeadSize.
void attention_forward(Storage dt, void* out, float* lse, const void* qkv, int B, int T, int C,
                       int NH, cudaStream_t stream);

// Bytes of device scratch attention_backward needs (D = dout . out per row, fp32 (B,NH,T)).
size_t attention_backward_scratch_bytes(int B, int T, int NH);

// dqkv (B,T,3C) = (overwrite) from dout (B,T,C), qkv, out and lse of the forward:
// D_i = dO_i . O_i, P = exp(S - lse), dS = P * (dO V^T - D), dQ = scale dS K, dK = scale dS^T Q,
// dV = P^T dO. dQ and (dK, dV) come from two kernels (query tiles and key tiles), so no
// gradient is accumulated across blocks (deterministic, no atomics).
void attention_backward(Storage dt, void* dqkv, const void* dout, const void* qkv, const void* out,
                        const float* lse, int B, int T, int C, int NH, float* scratch,
                        cudaStream_t stream);

}  // namespace zerod::cuda
