// Fused causal multi-head self-attention on the device (flash-attention style): the T x T score
// matrix is never stored; scores, softmax and products are computed per 32 x 32 tile in shared
// memory with fp32 accumulation. Layouts as kernels/cpu/attention.h: qkv (B,T,3C) with q, k, v
// at channels [0,C), [C,2C), [2C,3C), head h at [h*hs, (h+1)*hs), hs = C/NH, scale 1/sqrt(hs).
// Device pointers; asynchronous on `stream`.
//
// Two implementations behind these entry points. bf16 / fp16 storage with head size 32, 64 or
// 128 (and 16-byte aligned tensors) runs the tensor-core kernels of attention_tc.cu: 64 x 64
// tiles, WMMA 16x16x16 products with fp32 accumulation, softmax and dS in fp32 SIMT code,
// P and dS rounded to the storage dtype as product operands. Everything else (fp32, other head
// sizes) runs the SIMT fp32 kernels of attention.cu, as does every call when the environment
// variable ZEROD_ATTENTION=simt is set at start (or after set_attention_impl(kSimt)). The
// tensor-core kernels were verified only by emulating the WMMA API on the CPU (every lane holding
// the whole fragment, with checks of the API's alignment, ldm and whole-warp rules), not on a GPU:
// in that emulation against a double-precision reference, T 1..130, hs 32/64/128, NH 1/3, B 1/2,
// the max-norm relative error is below 1e-2 for bf16 and 1e-3 for fp16 (out, dq, dk, dv), lse
// ~1e-7.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/storage.h"

namespace zerod::cuda {

// The largest head size the kernels support (a lane holds up to 8 channels of a row).
constexpr int kAttentionMaxHeadSize = 256;

// Which kernels run: kAuto, the tensor-core ones where they apply (else SIMT); kSimt, always the
// SIMT ones. Starts as kSimt when ZEROD_ATTENTION=simt is set, else kAuto; process-wide (tests
// run both paths).
enum class AttentionImpl { kAuto, kSimt };
void set_attention_impl(AttentionImpl impl);
AttentionImpl attention_impl();

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
