// Single-precision matrix multiply for the CPU backend.
//
// Row-major: C (M,N) = alpha * op(A) (M,K) x op(B) (K,N) + beta * C, then + bias (N) on every
// row when bias is not null. op(X) = X or X^T; lda/ldb/ldc are row strides of the stored
// matrices (A stored (M,K) or, transposed, (K,M)). beta == 0 overwrites C without reading it
// (NaN in C does not propagate); K == 0 or alpha == 0 gives beta * C (+ bias) without reading A
// or B.
//
// Implementations: an AVX-512 engine of our own (kernels/cpu/gemm_avx512*: packed panels, a
// 14 x 32 register-blocked micro-kernel, OpenMP), chosen at run time when the CPU has AVX-512F
// whatever the build flags, so the fast path does not depend on how a BLAS library reads its
// environment (e.g. OPENBLAS_CORETYPE=Haswell halves OpenBLAS on AVX-512 CPUs); OpenBLAS
// cblas_sgemm plus a bias loop otherwise.
//
// Threads: the AVX-512 engine uses omp_get_max_threads() threads, and only the calling thread
// inside an OpenMP parallel region (omp_in_parallel()); its result is bit-identical for any
// thread count. The OpenBLAS fallback uses OpenBLAS's own threads (OPENBLAS_NUM_THREADS).
#pragma once

#include <cstdint>

namespace zerod::cpu {

enum class GemmImpl { kAuto, kAvx512, kBlas };

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
           const float* bias = nullptr);

// Forces an implementation (benchmarks, tests); kAuto restores the run-time choice. kAvx512 on
// a CPU without AVX-512F throws InputError.
void set_gemm_impl(GemmImpl impl);
// The implementation sgemm() uses now (kAuto resolved).
GemmImpl gemm_impl();
const char* gemm_impl_name(GemmImpl impl);

}  // namespace zerod::cpu
