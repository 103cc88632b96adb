#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cpu/bf16_gemm.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel.h"

namespace zerod::cpu {

namespace {

// sgemm with alpha 1, or its bf16-operand twin.
void gemm(bool bf16, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
          const float* bias = nullptr) {
  if (bf16) {
    bf16_gemm(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, bias);
  } else {
    sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc, bias);
  }
}

}  // namespace

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t N,
                    int C, int OC, bool bf16_products) {
  gemm(bf16_products, false, true, N, OC, C, inp, C, weight, C, 0.0f, out, OC, bias);
}

void column_sums_accumulate(float* dbias, const float* dout, int64_t N, int OC) {
  constexpr int kBlock = 128;  // columns per task: 512 contiguous bytes of each row
  const int blocks = static_cast<int>(ceil_div(OC, kBlock));
#pragma omp parallel for schedule(static) if (N * OC >= kParallelMinElems)
  for (int b = 0; b < blocks; ++b) {
    const int c0 = b * kBlock;
    const int cn = std::min(kBlock, OC - c0);
    float acc[kBlock] = {};
    for (int64_t r = 0; r < N; ++r) {
      const float* g = dout + r * OC + c0;
#pragma omp simd
      for (int c = 0; c < cn; ++c) acc[c] += g[c];
    }
#pragma omp simd
    for (int c = 0; c < cn; ++c) dbias[c0 + c] += acc[c];
  }
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int64_t N, int C, int OC, bool accumulate_dinp,
                     bool bf16_products, const uint16_t* dout_bf16) {
  if (bf16_products && N > 0 && C > 0 && OC > 0) {
    // dout converted once for both products (the classifier's is the largest operand), unless
    // the caller has it in bf16 already.
    thread_local std::vector<uint16_t> d16, w16, i16;
    const Bf16Operand d =
        dout_bf16 != nullptr ? Bf16Operand{dout_bf16, N, OC} : to_bf16(d16, dout, N, OC, OC);
    if (dinp != nullptr) {
      bf16_gemm(false, false, N, C, OC, d, to_bf16(w16, weight, OC, C, C),
                accumulate_dinp ? 1.0f : 0.0f, dinp, C);
    }
    if (dweight != nullptr) {
      bf16_gemm(true, false, OC, C, N, d, to_bf16(i16, inp, N, C, C), 1.0f, dweight, C);
    }
  } else {
    if (dinp != nullptr) {
      gemm(bf16_products, false, false, N, C, OC, dout, OC, weight, C,
           accumulate_dinp ? 1.0f : 0.0f, dinp, C);
    }
    if (dweight != nullptr) {
      gemm(bf16_products, true, false, OC, C, N, dout, OC, inp, C, 1.0f, dweight, C);
    }
  }
  if (dbias != nullptr) column_sums_accumulate(dbias, dout, N, OC);
}

}  // namespace zerod::cpu
