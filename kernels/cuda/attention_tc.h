// Tensor-core (WMMA) causal attention for bf16 / fp16 storage and head sizes 32, 64, 128: the
// fast path behind attention_forward / attention_backward of attention.h (which see for the
// layouts and contracts, grouped-query heads and windows included, and for when this path runs).
// Device pointers; asynchronous on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/storage.h"

namespace zerod::cuda {

// True when the tensor-core kernels handle this call: dt is kBF16 or kF16, the head size is 32,
// 64 or 128, and the tensors are 16-byte aligned (rows are read as 16-byte vectors; every row
// and head offset is then 16-byte aligned too, being a multiple of 32 elements).
bool attention_tc_supported(Storage dt, int head_size, const void* a, const void* b = nullptr,
                            const void* c = nullptr, const void* d = nullptr);

// As attention_forward; requires attention_tc_supported(dt, s.HS, out, qkv) and a valid shape
// (attention_forward checks it).
void attention_tc_forward(Storage dt, void* out, float* lse, const void* qkv,
                          const AttentionDims& s, cudaStream_t stream);

// As attention_backward (scratch: attention_backward_scratch_bytes, receives D); requires
// attention_tc_supported(dt, s.HS, dqkv, dout, qkv, out).
void attention_tc_backward(Storage dt, void* dqkv, const void* dout, const void* qkv,
                           const void* out, const float* lse, const AttentionDims& s,
                           float* scratch, cudaStream_t stream);

}  // namespace zerod::cuda
