// sgemm dispatch (gemm.h): the AVX-512 engine (gemm_avx512.h) when the CPU has AVX-512F or it
// is forced, else OpenBLAS cblas_sgemm plus a bias loop; the K == 0 / alpha == 0 shortcut and
// argument checks are shared by both.
#include "kernels/cpu/gemm.h"

#include <cblas.h>
#include <omp.h>

#include <atomic>

#include "core/cpu_info.h"
#include "core/error.h"
#include "kernels/cpu/gemm_avx512.h"

namespace zerod::cpu {

namespace {

std::atomic<GemmImpl> g_requested{GemmImpl::kAuto};

GemmImpl resolve(GemmImpl impl) {
  if (impl != GemmImpl::kAuto) return impl;
  return cpu_info().avx512f ? GemmImpl::kAvx512 : GemmImpl::kBlas;
}

// C (M,N) = beta * C (+ bias): the whole product is zero (K == 0 or alpha == 0). As in BLAS,
// beta == 0 overwrites C without reading it.
void scale_c(int64_t M, int64_t N, float beta, float* C, int64_t ldc, const float* bias) {
  for (int64_t i = 0; i < M; ++i) {
    float* row = C + i * ldc;
    if (beta == 0.0f) {
      for (int64_t j = 0; j < N; ++j) row[j] = 0.0f;
    } else if (beta != 1.0f) {
      for (int64_t j = 0; j < N; ++j) row[j] *= beta;
    }
    if (bias != nullptr) {
      for (int64_t j = 0; j < N; ++j) row[j] += bias[j];
    }
  }
}

void blas_sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                int64_t ldc, const float* bias) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(M), static_cast<blasint>(N),
              static_cast<blasint>(K), alpha, A, static_cast<blasint>(lda), B,
              static_cast<blasint>(ldb), beta, C, static_cast<blasint>(ldc));
  if (bias != nullptr) {
    for (int64_t i = 0; i < M; ++i) {
      float* row = C + i * ldc;
      for (int64_t j = 0; j < N; ++j) row[j] += bias[j];
    }
  }
}

}  // namespace

void set_gemm_impl(GemmImpl impl) {
  if (impl == GemmImpl::kAvx512 && !cpu_info().avx512f) {
    ZD_THROW_INPUT("sgemm implementation 'avx512' requested, but this CPU ({}) has no AVX-512F",
                   cpu_info().model.empty() ? "unknown model" : cpu_info().model);
  }
  g_requested.store(impl);
}

GemmImpl gemm_impl() {
  return resolve(g_requested.load());
}

const char* gemm_impl_name(GemmImpl impl) {
  switch (impl) {
    case GemmImpl::kAuto:
      return "auto";
    case GemmImpl::kAvx512:
      return "avx512";
    case GemmImpl::kBlas:
      return "openblas";
  }
  return "?";
}

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
           const float* bias) {
  ZD_CHECK(M >= 0 && N >= 0 && K >= 0, "sgemm sizes M={} N={} K={}", M, N, K);
  if (M == 0 || N == 0) return;
  ZD_CHECK(ldc >= N, "sgemm ldc={} < N={}", ldc, N);
  if (K == 0 || alpha == 0.0f) {
    scale_c(M, N, beta, C, ldc, bias);
    return;
  }
  ZD_CHECK(lda >= (trans_a ? M : K), "sgemm lda={} too small (trans_a={} M={} K={})", lda, trans_a,
           M, K);
  ZD_CHECK(ldb >= (trans_b ? K : N), "sgemm ldb={} too small (trans_b={} N={} K={})", ldb, trans_b,
           N, K);
  if (gemm_impl() == GemmImpl::kAvx512) {
    // Inside an OpenMP parallel region the caller already spreads work over the cores.
    const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
    gemm_avx512::sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias,
                       threads);
  } else {
    blas_sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias);
  }
}

}  // namespace zerod::cpu
