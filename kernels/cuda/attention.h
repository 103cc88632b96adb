// Fused causal self-attention on the device (flash-attention style), multi-head and
// grouped-query, optionally with a sliding window: the T x T score matrix is never stored;
// scores, softmax and products are computed per 32 x 32 tile in shared memory with fp32
// accumulation. Layouts as kernels/backend.h (attention_forward): a qkv row holds NH query heads,
// then KVH key heads, then KVH value heads, HS channels each; query head h reads key/value head
// h / (NH/KVH); out rows hold NH heads; scale 1/sqrt(HS); position i attends to j in
// (i - window, i] (window 0: [0, i]). Device pointers; asynchronous on `stream`.
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
// ~1e-7. Grouped-query heads, windows and the KV cache kernels (both implementations) were
// checked the same way only: in a host emulation of the CUDA execution model (a fiber per
// thread, warp collectives and __syncthreads as checked scheduling points, several schedules),
// against a double-precision reference, not on a GPU.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/cuda/storage.h"

namespace zerod::cuda {

// The largest head size the kernels support (a lane holds up to 8 channels of a row).
constexpr int kAttentionMaxHeadSize = 256;

// The shape of one attention call: the twin of zerod::AttentionShape (kernels/backend.h, which
// .cu files cannot include). NH % KVH == 0, 1 <= HS <= kAttentionMaxHeadSize, window >= 0.
struct AttentionDims {
  int B = 0, T = 0;
  int NH = 0;      // query heads
  int KVH = 0;     // key/value heads
  int HS = 0;      // head size
  int window = 0;  // 0: causal; W > 0: position i sees j in (i - W, i]
  // Document masking (null: none): (B,T) int32 device array, position i of row b sees only
  // j >= doc_start[b,i] (non-decreasing in i; see zerod::AttentionShape). Only
  // attention_forward / attention_backward take it, and only their SIMT kernels implement it:
  // a call with doc_start always runs the SIMT kernels of attention.cu (the mma.sync and WMMA
  // kernels are not extended). Tested against the CPU on an H100.
  const int32_t* doc_start = nullptr;

  int64_t qkv_row() const { return static_cast<int64_t>(NH + 2 * KVH) * HS; }
  int64_t out_row() const { return static_cast<int64_t>(NH) * HS; }
};

// Which kernels run: kAuto, the fastest that applies: the mma.sync kernels of attention_mma.cu
// (bf16/fp16, head size 64, no window), else the WMMA tensor-core ones, else SIMT (always SIMT
// with document masking, doc_start); kWmma, the
// WMMA ones where they apply (else SIMT); kSimt, always the SIMT ones. Starts as set by the
// environment variable ZEROD_ATTENTION (simt or wmma) at start, else kAuto; process-wide (tests
// run every path).
enum class AttentionImpl { kAuto, kWmma, kSimt };
void set_attention_impl(AttentionImpl impl);
AttentionImpl attention_impl();

// The kernel variants the mma path runs (attention_mma.h: bitwise the same outputs, different
// tile shapes and register budgets). Start as ZEROD_ATTENTION_MMA=f,q,k (forward, dQ, dK/dV
// variant numbers; a malformed or out-of-range value throws InputError naming the variable, when
// the CUDA backend is made) or the defaults below (the fastest on an H100 at GPT-2 124M's shape,
// measured by zerod_attention_bench: forward 1, dQ 3, dK/dV 3); process-wide, for benches and
// tests.
struct MmaVariants {
  int forward = 1;
  int dq = 3;
  int dkdv = 3;
};
void set_attention_mma_variants(MmaVariants v);  // (InputError for a variant that does not exist)
MmaVariants attention_mma_variants();
// "f,q,k" as ZEROD_ATTENTION_MMA reads it; InputError naming the variable otherwise.
MmaVariants parse_attention_mma_variants(const std::string& value);

// out (B,T,NH*HS) =; lse (B,NH,T) = log-sum-exp of each scaled, masked score row (fp32).
void attention_forward(Storage dt, void* out, float* lse, const void* qkv, const AttentionDims& s,
                       cudaStream_t stream);

// Bytes of device scratch attention_backward needs (D = dout . out per row, fp32 (B,NH,T)).
size_t attention_backward_scratch_bytes(const AttentionDims& s);

// dqkv (B,T,(NH+2*KVH)*HS) = (overwrite) from dout (B,T,NH*HS), qkv, out and lse of the forward:
// D_i = dO_i . O_i, P = exp(S - lse), dS = P * (dP - D), dP = dO V^T, dQ = scale dS K,
// dK = scale dS^T Q, dV = P^T dO, dK and dV of a key/value head summed over its query heads.
// dQ and (dK, dV) come from two kernels (query tiles of a query head; key tiles of a key/value
// head, walking its query heads in order), so no gradient is accumulated across blocks
// (deterministic, no atomics).
void attention_backward(Storage dt, void* dqkv, const void* dout, const void* qkv, const void* out,
                        const float* lse, const AttentionDims& s, float* scratch,
                        cudaStream_t stream);

// Generation with a KV cache: the k and v heads of qkv (B,T,(NH+2*KVH)*HS), T new positions
// pos0 .. pos0+T-1, are written to kcache, vcache (B,maxT,KVH*HS) at those positions; then
// out (B,T,NH*HS) = the attention of each new query over the cached positions it sees (causal,
// window). pos0 >= 0, pos0 + T <= maxT. SIMT fp32 kernels whatever the implementation choice.
void attention_kv_cache(Storage dt, void* out, const void* qkv, void* kcache, void* vcache,
                        int pos0, int maxT, const AttentionDims& s, cudaStream_t stream);

}  // namespace zerod::cuda
