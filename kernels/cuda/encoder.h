// Token + position embedding on the device. Device pointers (tokens too); asynchronous on
// `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/storage.h"

namespace zerod::cuda {

// out (B,T,C) = wte[tokens[b,t]] + wpe[t]; tokens (B,T) in [0, Vp); wte (Vp,C); wpe (>=T,C).
// wpe may be null (no position embedding: out = wte[tokens]). A token < 0 has no row here (a
// vocabulary-parallel shard that does not hold it): its wte term is 0 (out = wpe[t], or 0).
// doc_start (B,T) int32 (device), or null: document masking, the position row of (b,t) is
// wpe[t - doc_start[b,t]] (kernels/backend.h AttentionShape).
void encoder_forward(Storage dt, void* out, const int32_t* tokens, const void* wte, const void* wpe,
                     int B, int T, int C, cudaStream_t stream, const int32_t* doc_start = nullptr);

// Bytes of device scratch encoder_backward needs for B*T rows.
size_t encoder_backward_scratch_bytes(int64_t rows);

// dwte (Vp,C) +=, dwpe (T,C) += from dout (B,T,C); dwpe may be null (no position embedding).
// Positions whose token is < 0 add to dwpe only.
// Deterministic, without atomics: the rows are
// sorted by token (stable radix sort of (token, row)), and each distinct token's row of dwte is
// accumulated by one thread per channel in position order, in fp32 starting from its old value
// (the order of kernels/cpu/encoder.cc). `scratch` holds encoder_backward_scratch_bytes(B*T).
// With doc_start (as encoder_forward's) row (b,t) adds to dwpe[t - doc_start[b,t]]: one thread
// per (position p, channel) sums the rows at position p of each document, b then t in order
// (the CPU's order), finding the documents that reach p by jumps along doc_start.
void encoder_backward(Storage dt, void* dwte, void* dwpe, const void* dout, const int32_t* tokens,
                      int B, int T, int C, void* scratch, size_t scratch_bytes, cudaStream_t stream,
                      const int32_t* doc_start = nullptr);

}  // namespace zerod::cuda
