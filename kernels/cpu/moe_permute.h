// Token permutation of a mixture-of-experts layer, fp32: the tokens' kept assignments gathered
// into expert-contiguous rows (the layout the grouped matmul reads, and what an expert-parallel
// all-to-all sends), and the combine that scatters the experts' rows back into the tokens,
// weighted by the router's weights; with their backwards.
//
// The plan (from the router's expert (N,k), -1 = dropped): expert e owns rows
// [offsets[e], offsets[e+1]) of the permuted matrix, R = offsets[E] rows in all; within an
// expert the rows follow token order (a stable sort by expert, as Megatron's and MegaBlocks'
// permutations). Every result is independent of the thread count: each output row is written by
// one thread, and a token's slots are summed in slot order.
#pragma once

#include <cstdint>

namespace zerod::cpu {

// offsets (E+1) = expert row offsets (offsets[0] = 0); row_token (R) = the token of each
// permuted row; slot_row (N,k) = the permuted row of each assignment (-1 where dropped), from
// expert (N,k) int32 (each entry in [0, E) or -1). Returns R. Throws on an expert outside
// [-1, E).
int64_t moe_permute_plan(int64_t* offsets, int32_t* row_token, int32_t* slot_row,
                         const int32_t* expert, int64_t N, int k, int E);

// xp (R,C) = x (N,C) gathered: xp[r] = x[row_token[r]].
void moe_permute_forward(float* xp, const float* x, const int32_t* row_token, int64_t R, int C);
// dx (N,C) += the rows of dxp (R,C) summed into their tokens (a token's slots in slot order).
void moe_permute_backward(float* dx, const float* dxp, const int32_t* slot_row, int64_t N, int k,
                          int C);

// The combine: y (N,C) = sum over the kept slots j of token n of weight[n,j] * yp[slot_row[n,j]]
// (yp (R,C) the experts' output rows); a token with every slot dropped gets 0.
void moe_unpermute_forward(float* y, const float* yp, const float* weight, const int32_t* slot_row,
                           int64_t N, int k, int C);
// Its backward from dy (N,C): dyp (R,C) = weight[n,j] * dy[n] in the row of each kept slot;
// dweight (N,k) = dot(dy[n], yp[slot_row[n,j]]) (0 where dropped; may be null).
void moe_unpermute_backward(float* dyp, float* dweight, const float* dy, const float* yp,
                            const float* weight, const int32_t* slot_row, int64_t N, int k, int C);

}  // namespace zerod::cpu
