// Matrix products on bf16 operands with fp32 accumulation, for the CPU backend's bf16 mode.
//
// The contract of sgemm (gemm.h) with alpha = 1: row-major C (M,N) = op(A) (M,K) x op(B) (K,N) +
// beta C (+ bias (N) on every row when not null); lda/ldb/ldc are the stored matrices' row
// strides. A and B are fp32 arrays whose values are converted to bf16 (round to nearest even:
// exact for values already rounded to bf16, which is what bf16 mode holds); the products
// accumulate in fp32 and C stays fp32. So for bf16-valued inputs the result differs from
// sgemm's only in the order of the fp32 sums.
//
// Implementation: oneDNN's matmul (kernels/cpu/onednn/bf16_gemm.cc), which runs the CPU's bf16
// dot-product instructions (AVX512-BF16; AMX where present). Available only when zerod was
// built with oneDNN (libdnnl-dev) and the CPU has avx512_bf16 or amx_bf16; otherwise
// bf16_gemm_unavailable() says why and the CPU backend computes bf16 mode's products in fp32.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zerod::cpu {

// Empty when bf16_gemm can run here; else why not (not built with oneDNN, or the CPU's flags).
std::string bf16_gemm_unavailable();

// As sgemm with alpha = 1 (see above); requires bf16_gemm_unavailable().empty(). Thread-safe
// (each calling thread keeps its own oneDNN stream, conversion buffers and primitives).
void bf16_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A,
               int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
               const float* bias = nullptr);

// An operand converted once for several products (a matmul's backward reads dout twice): the
// stored (rows, cols) matrix as compact bf16 in `storage`, which must outlive its uses.
struct Bf16Operand {
  const uint16_t* data = nullptr;
  int64_t rows = 0, cols = 0;
};
Bf16Operand to_bf16(std::vector<uint16_t>& storage, const float* in, int64_t rows, int64_t cols,
                    int64_t ld);

// bf16_gemm on operands already converted: A is op(A)'s stored matrix ((M,K), or (K,M) when
// trans_a), B likewise.
void bf16_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, Bf16Operand A,
               Bf16Operand B, float beta, float* C, int64_t ldc, const float* bias = nullptr);

}  // namespace zerod::cpu
