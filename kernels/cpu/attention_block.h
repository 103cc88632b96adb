// Attention of local queries over one block of keys and values at global positions: the
// building block of ring attention (context parallelism), fp32. The CPU reference of
// Backend::attention_block_forward / attention_block_backward (kernels/backend.h).
//
// Layouts (AttentionShape s, s.T = Tq local query rows):
//   qkv  (B,Tq,(NH+2*KVH)*HS)  the local rows in attention_forward's layout; only the NH query
//                              heads are read (the key/value heads travel as kv blocks)
//   qpos (Tq) int32            global position of each local row, shared by the batch
//   kv   (B,Tk,2*KVH*HS)       per key row: the KVH key heads, then the KVH value heads
//   kpos (Tk) int32            global position of each key row, shared by the batch
//   out  (B,Tq,NH*HS), lse (B,NH,Tq) fp32, dout as out
// Query i may see key j iff kpos[j] <= qpos[i] and, with a window W = s.window > 0,
// kpos[j] > qpos[i] - W (attention_forward's mask, on global positions). Positions may come in
// any order (a load-balanced causal split holds chunks r and 2C-1-r of the sequence); sorted
// key positions only make finding the visible keys cheaper. Query head h reads key/value head
// h / (NH/KVH). Scores are scaled by 1/sqrt(HS).
//
// Forward: split over (b, h) pairs, queries in blocks of kAttentionBlockQ rows; a query block
// only multiplies the key columns [first, last] some of its rows see. The block's softmax
// (max m, sum l, unnormalised P V) is merged into (out, lse) by the online-softmax rule. Backward
// (FlashAttention-2's, with the final out and lse of the whole sequence): split over (b, kv head)
// pairs, each running its query heads in order, so dK/dV sums over a shared head have a fixed
// order. Results do not depend on the thread count.
#pragma once

#include <cstdint>

#include "kernels/backend.h"

namespace zerod::cpu {

// out (B,Tq,NH*HS), lse (B,NH,Tq): with first_block, = the attention of the queries over this
// block's keys (a row that sees none of them: out 0, lse -inf); otherwise merged with what they
// hold: lse' = log(exp(lse) + exp(lse_b)), out' = out exp(lse - lse') + out_b exp(lse_b - lse')
// (rows that see no key of the block keep theirs). After every block of the sequence, in any
// order, out and lse equal attention_forward's over the whole sequence (up to rounding).
// Throws Error (internal) on a bad shape or Tk < 0.
void attention_block_forward(float* out, float* lse, const float* qkv, const int32_t* qpos,
                             const float* kv, const int32_t* kpos, int Tk, const AttentionShape& s,
                             bool first_block);

// The gradients of one block, from dout and the FINAL out and lse (after every block):
// D_i = dO_i . O_i, P = exp(S - lse) on the visible pairs (0 elsewhere, and for a row whose lse
// is -inf), dP = dO V^T, dS = P * (dP - D); dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO.
// dqkv (B,Tq,(NH+2*KVH)*HS): the query heads += dQ (the key/value columns are not touched);
// dkv (B,Tk,2*KVH*HS) = (or += with accumulate_dkv) dK, dV of the block, summed over the query
// heads of each key/value head. Summed over the blocks of the sequence, dQ and each block's dK,
// dV equal attention_backward's.
void attention_block_backward(float* dqkv, float* dkv, const float* dout, const float* qkv,
                              const int32_t* qpos, const float* kv, const int32_t* kpos, int Tk,
                              const float* out, const float* lse, const AttentionShape& s,
                              bool accumulate_dkv);

}  // namespace zerod::cpu
