// Attention of local queries over one key/value block at global positions on the device (ring
// attention): the CUDA twin of kernels/cpu/attention_block.h, with its layouts, mask and merge
// rule (kernels/backend.h, attention_block_forward / attention_block_backward):
//   qkv (B,Tq,(NH+2*KVH)*HS) (query heads read), qpos (Tq) int32, kv (B,Tk,2*KVH*HS) (key heads
//   then value heads), kpos (Tk) int32, out (B,Tq,NH*HS), lse (B,NH,Tq) fp32;
//   query i sees key j iff kpos[j] <= qpos[i] and (window 0 or kpos[j] > qpos[i] - window).
// Positions are device memory and may come in any order: the kernels walk every tile of the
// other side and skip, after one block-wide vote, the tiles in which no (query, key) pair is
// visible. Device pointers; asynchronous on `stream`. SIMT fp32 kernels (32 x 32 tiles, as
// attention.cu's) for every storage dtype and head size 1..kAttentionMaxHeadSize; 16-bit
// storage rounds out after each block and dq / dkv after each accumulation.
//
// Not yet run on a GPU: written against the CPU reference (tests/unit/kernels_cuda/
// attention_block_test.cc holds them together where a GPU is present).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/storage.h"

namespace zerod::cuda {

// out, lse: with first_block =, otherwise merged (online softmax) with what they hold; a row that
// sees no key of the block gets out 0, lse -inf (first_block) or keeps its values. s.T = Tq.
void attention_block_forward(Storage dt, void* out, float* lse, const void* qkv,
                             const int32_t* qpos, const void* kv, const int32_t* kpos, int Tk,
                             const AttentionDims& s, bool first_block, cudaStream_t stream);

// Bytes of device scratch attention_block_backward needs (D = dout . out per row, (B,NH,Tq)).
size_t attention_block_backward_scratch_bytes(const AttentionDims& s);

// From dout and the final out and lse: dqkv's query heads += dQ of this block (key/value columns
// untouched); dkv (B,Tk,2*KVH*HS) = (or += with accumulate_dkv) dK, dV of the block, each
// key/value head summed over its query heads in order (no atomics: deterministic).
void attention_block_backward(Storage dt, void* dqkv, void* dkv, const void* dout, const void* qkv,
                              const int32_t* qpos, const void* kv, const int32_t* kpos, int Tk,
                              const void* out, const float* lse, const AttentionDims& s,
                              bool accumulate_dkv, float* scratch, cudaStream_t stream);

}  // namespace zerod::cuda
