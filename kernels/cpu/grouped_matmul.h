// Dropless grouped matmul of a mixture-of-experts layer (Megatron's / MegaBlocks' grouped GEMM):
// one call computes, for every expert e, its block of expert-contiguous rows against its own
// weight, however many rows each expert got (none included), without padding every expert to
// the largest count. Each block is one matmul_forward / matmul_backward (matmul.h, the sgemm
// engine; bf16 products when asked), so a block's bits equal a plain matmul of its rows, for
// any thread count (large experts run in turn on all threads, small ones side by side, one
// thread each: grouped_matmul.cc).
//
// Layout (the matmul's convention, so an expert's weight is a Linear's (OC,C), as Mixtral's
// w1/w2/w3): expert e owns rows [offsets[e], offsets[e+1]) of inp and out, R = offsets[E].
#pragma once

#include <cstdint>

namespace zerod::cpu {

// out (R,OC) rows of e = inp (R,C) rows of e x weight[e] (OC,C)^T + bias[e] (OC).
// weight (E,OC,C); bias (E,OC) or null; offsets (E+1) non-decreasing host memory, offsets[0] = 0.
// weight[e] lies e x weight_stride elements after weight[0] (0: OC x C, packed), bias[e] e x
// bias_stride after bias[0] (0: OC); dweight and dbias below take the same strides.
void grouped_matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                            const int64_t* offsets, int E, int C, int OC,
                            bool bf16_products = false, int64_t weight_stride = 0,
                            int64_t bias_stride = 0);

// Per expert e: dinp rows (R,C) = (or += when accumulate_dinp) dout rows (R,OC) x weight[e];
// dweight[e] (OC,C) += dout rows^T x inp rows; dbias[e] (OC) += column sums of dout rows
// (skipped when null). dinp may be null. An expert without rows leaves its dweight and dbias.
void grouped_matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                             const float* inp, const float* weight, const int64_t* offsets, int E,
                             int C, int OC, bool accumulate_dinp, bool bf16_products = false,
                             int64_t weight_stride = 0, int64_t bias_stride = 0);

// Throws unless offsets (E+1) starts at 0 and never decreases.
void check_group_offsets(const int64_t* offsets, int E);

}  // namespace zerod::cpu
