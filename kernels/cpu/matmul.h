// Fully connected layer out = inp @ weight^T + bias, fp32, on top of sgemm (gemm.h); with
// bf16_products the matrix products run on bf16 operands with fp32 accumulation (bf16_gemm.h),
// for bf16 mode, whose tensors hold bf16 values.
#pragma once

#include <cstdint>

namespace zerod::cpu {

// out (N,OC) = inp (N,C) x weight (OC,C)^T + bias (OC, may be null).
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t N,
                    int C, int OC, bool bf16_products = false);

// dinp (N,C) = (or += when accumulate_dinp) dout (N,OC) x weight (OC,C); skipped when null.
// dweight (OC,C) += dout^T x inp (skipped when null).
// dbias (OC) += column sums of dout (skipped when null); each column is summed over rows in
// order by one thread (thread-count independent).
// dout_bf16 (N,OC), with bf16_products and when not null: dout's bf16 bits (dout holds bf16
// values), used for the products instead of converting dout.
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int64_t N, int C, int OC, bool accumulate_dinp,
                     bool bf16_products = false, const uint16_t* dout_bf16 = nullptr);

// dbias (OC) += column sums of dout (N,OC).
void column_sums_accumulate(float* dbias, const float* dout, int64_t N, int OC);

}  // namespace zerod::cpu
