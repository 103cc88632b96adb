// Single-precision matrix multiply for the CPU backend.
//
// Row-major: C (M,N) = alpha * op(A) (M,K) x op(B) (K,N) + beta * C, then + bias (N) on every
// row when bias is not null. op(X) = X or X^T; lda/ldb/ldc are row strides of the stored
// matrices (A stored (M,K) or, transposed, (K,M)).
//
// Implementations: an AVX-512 engine of our own (packed panels, register-blocked micro-kernel,
// OpenMP), chosen at run time when the CPU has AVX-512F, so the fast path does not depend on
// how a BLAS library reads its environment (e.g. OPENBLAS_CORETYPE); OpenBLAS cblas_sgemm
// otherwise. Inside an OpenMP parallel region the call runs on the calling thread only.
#pragma once

#include <cstdint>

namespace zerod::cpu {

enum class GemmImpl { kAuto, kAvx512, kBlas };

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
           const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
           int64_t ldc, const float* bias = nullptr);

// Forces an implementation (benchmarks, tests). kAvx512 on a CPU without AVX-512 throws.
void set_gemm_impl(GemmImpl impl);
// The implementation sgemm() uses now (kAuto resolved).
GemmImpl gemm_impl();
const char* gemm_impl_name(GemmImpl impl);

}  // namespace zerod::cpu
