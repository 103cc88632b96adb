// Causal self-attention (multi-head and grouped-query, optional sliding window), fp32, without
// materialising the T x T scores of all heads.
//
// Layout (kernels/backend.h, AttentionShape s): a qkv row holds the NH query heads, then the
// KVH key heads, then the KVH value heads, HS channels each (row stride s.qkv_row() =
// (NH+2*KVH)*HS); query head h reads key/value head h / (NH/KVH) in place (K and V are never
// copied per query head); out rows hold NH*HS channels. Scores are scaled by 1/sqrt(HS);
// position i attends to keys j <= i, and with a window W > 0 only to j > i - W. With document
// masking (s.doc_start, (B,T) int32, non-decreasing in t) query i of batch row b also sees only
// keys j >= doc_start[b,i]; a query block then starts at its first row's lower bound.
//
// Forward: work is split over (b, h) pairs (one OpenMP thread each, with its own scratch);
// within a pair queries are processed in blocks of kAttentionBlockQ rows, and a block only
// touches the keys some of its queries can see (the fully masked key ranges before the window
// and after the block's last query are skipped). Matrix products are sgemm calls on strided
// views of qkv. Backward: split over (b, kv head) pairs, each running its query heads in order,
// so the dK/dV sums over a shared head have a fixed order. Results do not depend on the thread
// count; for MHA without a window they equal the previous (MHA-only) kernel's bit for bit.
#pragma once

#include <cstdint>

#include "kernels/backend.h"

namespace zerod::cpu {

constexpr int kAttentionBlockQ = 64;

// Throws Error (an internal check: models validate their configs) unless NH > 0, KVH > 0,
// NH % KVH == 0, HS > 0, B >= 0, T >= 0 and window >= 0.
void check_attention_shape(const AttentionShape& s);

// out (B,T,NH*HS) = softmax(mask(q k^T * scale)) v per query head; lse (B,NH,T) = log-sum-exp
// of each scaled, masked score row (fp32), kept for the backward.
void attention_forward(float* out, float* lse, const float* qkv, const AttentionShape& s);

// dqkv (B,T,(NH+2*KVH)*HS) = (overwrite) gradients of q, k, v from dout (B,T,NH*HS),
// recomputing the softmax from qkv and lse: dP = dO V^T, D_i = dO_i . O_i, dS = P * (dP - D),
// dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO (dK, dV summed over the query heads of a
// kv head, in head order).
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, const AttentionShape& s);

// Generation with a KV cache: qkv (B,Tq,(NH+2*KVH)*HS) holds Tq = s.T new positions
// pos0 .. pos0+Tq-1; their k and v heads are written to kcache, vcache (B,maxT,KVH*HS) at those
// positions, then out (B,Tq,NH*HS) = attention of each new query over the cached positions it
// may see (causal, s.window), the same computation as attention_forward over the whole
// sequence. Requires 0 <= pos0 and pos0 + Tq <= maxT.
void attention_kv_cache(float* out, const float* qkv, float* kcache, float* vcache, int pos0,
                        int maxT, const AttentionShape& s);

}  // namespace zerod::cpu
