// Register-resident tensor-core causal attention (FlashAttention-2 style, mma.sync m16n8k16
// with ldmatrix): the fast path behind attention_forward / attention_backward of attention.h
// (which see for the layouts and contracts) for bf16 / fp16 storage, head size 64, no sliding
// window, grouped-query heads included. Scores, probabilities, the running softmax statistics
// and every accumulator (O, dQ, dK, dV) stay in registers in the mma fragment layout; only the
// Q/K/V/dO tiles pass through shared memory. The backward keeps the contract of the other
// implementations: D_i = dO_i . O_i to the scratch, then dQ (per query tile) and dK/dV (per key
// tile, summing the query heads of a key/value head) from two kernels, deterministic, no
// atomics. Device pointers; asynchronous on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/storage.h"

namespace zerod::cuda {

// True when these kernels handle the call: dt is kBF16 or kF16, head size 64, no window (or one
// of T or more), and the tensors 16-byte aligned.
bool attention_mma_supported(Storage dt, const AttentionDims& s, const void* a,
                             const void* b = nullptr, const void* c = nullptr,
                             const void* d = nullptr);

// Kernel variants (attention_mma.cu: tile rows per block, fragments held in registers or
// reloaded, columns per pass, blocks per SM); every variant gives bitwise the same outputs, they
// differ in speed only. 0 is each kernel's first version.
constexpr int kMmaForwardVariants = 4;
constexpr int kMmaDqVariants = 5;
constexpr int kMmaDkdvVariants = 5;

// As attention_forward; requires attention_mma_supported. variant < kMmaForwardVariants.
void attention_mma_forward(Storage dt, void* out, float* lse, const void* qkv,
                           const AttentionDims& s, cudaStream_t stream, int variant);

// As attention_backward (scratch: attention_backward_scratch_bytes, receives D); requires
// attention_mma_supported. dq_variant < kMmaDqVariants, dkdv_variant < kMmaDkdvVariants.
void attention_mma_backward(Storage dt, void* dqkv, const void* dout, const void* qkv,
                            const void* out, const float* lse, const AttentionDims& s,
                            float* scratch, cudaStream_t stream, int dq_variant, int dkdv_variant);

}  // namespace zerod::cuda
