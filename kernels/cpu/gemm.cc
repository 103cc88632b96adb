#include "kernels/cpu/gemm.h"

#include <cblas.h>

#include "core/cpu_info.h"
#include "core/error.h"

namespace zerod::cpu {

namespace {
GemmImpl g_impl = GemmImpl::kBlas;
}

void set_gemm_impl(GemmImpl impl) { g_impl = impl == GemmImpl::kAuto ? GemmImpl::kBlas : impl; }
GemmImpl gemm_impl() { return g_impl; }
const char* gemm_impl_name(GemmImpl impl) {
  switch (impl) {
    case GemmImpl::kAuto: return "auto";
    case GemmImpl::kAvx512: return "avx512";
    case GemmImpl::kBlas: return "openblas";
  }
  return "?";
}

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
           const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
           int64_t ldc, const float* bias) {
  if (M == 0 || N == 0) return;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  if (bias != nullptr) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] += bias[j];
  }
}

}  // namespace zerod::cpu
