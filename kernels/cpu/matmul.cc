#include "kernels/cpu/matmul.h"

#include <algorithm>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel.h"

namespace zerod::cpu {

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t N,
                    int C, int OC) {
  sgemm(false, true, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC, bias);
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
                     const float* weight, int64_t N, int C, int OC, bool accumulate_dinp) {
  if (dinp != nullptr) {
    sgemm(false, false, N, C, OC, 1.0f, dout, OC, weight, C, accumulate_dinp ? 1.0f : 0.0f, dinp,
          C);
  }
  sgemm(true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
  if (dbias != nullptr) column_sums_accumulate(dbias, dout, N, OC);
}

}  // namespace zerod::cpu
