// Causal multi-head self-attention, fp32, without materialising the T x T scores of all heads.
//
// qkv (B,T,3C): q = channels [0,C), k = [C,2C), v = [2C,3C); head h uses channels
// [h*hs, (h+1)*hs) of each, hs = C/NH; scores are scaled by 1/sqrt(hs).
//
// Work is split over (b, h) pairs (one OpenMP thread each, with its own scratch); within a pair
// queries are processed in blocks of kAttentionBlockQ rows, and a block only touches the keys
// up to its last query (the fully masked key blocks are skipped). Matrix products are sgemm
// calls on strided views of qkv (row stride 3C). Results do not depend on the thread count.
#pragma once

#include <cstdint>

namespace zerod::cpu {

constexpr int kAttentionBlockQ = 64;

// out (B,T,C) = softmax(mask(q k^T * scale)) v per head; lse (B,NH,T) = log-sum-exp of each
// scaled, masked score row (fp32), kept for the backward.
void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH);

// dqkv (B,T,3C) = (overwrite) gradients of q, k, v from dout (B,T,C), recomputing the softmax
// from qkv and lse: dP = dO V^T, D_i = dO_i . O_i, dS = P * (dP - D), dQ = scale dS K,
// dK = scale dS^T Q, dV = P^T dO.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int B, int T, int C, int NH);

}  // namespace zerod::cpu
