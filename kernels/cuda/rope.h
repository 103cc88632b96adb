// Rotary position embedding on the device, Hugging Face's rotate-half convention (the formula of
// kernels/backend.h rope_forward): fp32 math on compute-dtype storage, fp32 cos / sin tables.
// Device pointers; asynchronous on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/storage.h"

namespace zerod::cuda {

// In place on the q and k heads (the first NH + KVH heads, HS channels each) of each row of
// qkv (B,T,(NH+2*KVH)*HS); v untouched. For each head x and i < HS/2, with c = cos[t,i],
// s = sin[t,i]: (x[i], x[i+HS/2]) = (x[i] c - x[i+HS/2] s, x[i+HS/2] c + x[i] s).
// cos, sin (T, HS/2) fp32. HS even. doc_start (B,T) int32 (device), or null: document masking,
// row (b,t) takes the table row t - doc_start[b,t] (kernels/backend.h AttentionShape).
void rope_forward(Storage dt, void* qkv, const float* cos, const float* sin, int B, int T, int NH,
                  int KVH, int HS, cudaStream_t stream, const int32_t* doc_start = nullptr);

// The inverse rotation (the transpose: s -> -s), in place on the q and k heads of dqkv.
void rope_backward(Storage dt, void* dqkv, const float* cos, const float* sin, int B, int T, int NH,
                   int KVH, int HS, cudaStream_t stream, const int32_t* doc_start = nullptr);

}  // namespace zerod::cuda
