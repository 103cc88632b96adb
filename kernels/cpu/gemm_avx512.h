// The AVX-512 SGEMM engine behind sgemm() (kernels/cpu/gemm.h): BLIS/GotoBLAS-style loops over
// packed blocks of A and B around a register-blocked 14 x 32 micro-kernel.
//
// C is split into one rectangular region per thread (choose_grid in gemm_avx512.cc); a thread
// packs its own blocks, so threads never wait on each other. One thread's loops over its region:
//   for ic in rows step mc:                A~ block (mc, kc): the thread's rows, in L3
//     for pc in K step kc:                 kc depends on K only, never on the threads
//       pack A~
//       for jc in columns step nc:         B~ block (kc, nc): stays in L2
//         pack B~
//         for ir in A~ step kMr:           A~ micro-panel (kc, 14): reused from L1
//           for jr in B~ step kNr:         B~ micro-panels stream from L2; C tiles along a row
//             micro-tile: C (14, 32) = alpha * A~ x B~ + beta * C (+ bias on the last pc)
// Every C element is accumulated in the same order (k ascending within a kc block, blocks in
// order, starting from zero in each block) by every micro-kernel variant, so the result is
// bit-identical for any thread count and any split of C.
//
// Only gemm.cc calls into here, and only when cpu_info().avx512f is true: the micro-kernels
// and packing routines are compiled for AVX-512 whatever the build's -march
// (gemm_avx512_target.h); the driver and everything else stay portable.
#pragma once

#include <cstdint>

namespace zerod::cpu::gemm_avx512 {

// Micro-tile and cache-block sizes, measured on an AVX-512 Xeon (48 KB L1d, 2 MB L2 per core)
// with tools/bench/gemm_bench.cc over 2048^3 and the training shapes. A larger kc means fewer
// passes over C; kc = 768 beat 256 and 384 by 3-10% on K >= 768 shapes.
inline constexpr int kMr = 14;        // rows of a micro-tile: 14 x 2 zmm accumulators
inline constexpr int kNr = 32;        // columns of a micro-tile: two 16-float vectors
inline constexpr int64_t kKc = 768;   // k block (A~ micro-panel 14 x 768: 42 KB, about L1)
inline constexpr int64_t kMc = 1536;  // rows of an A~ block (4.5 MB at kc = 768, in L3)
inline constexpr int64_t kNc = 320;   // columns of a B~ block (960 KB at kc = 768, in L2)

// C (M,N) = alpha * op(A) x op(B) + beta * C (+ bias (N) on every row); the contract of
// zerod::cpu::sgemm. Requires M, N, K > 0 and alpha != 0 (gemm.cc handles the rest). Runs on
// at most `threads` OpenMP threads (1: on the calling thread, no parallel region).
void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
           const float* bias, int threads);

// ---- pieces used by the driver (gemm_avx512.cc) ----------------------------------------------

// How a micro-tile is stored: C = alpha * acc + beta * C (C not read when beta == 0), then
// + bias[j] when bias is not null (bias already offset to the tile's first column).
struct TileStore {
  float alpha = 1.0f;
  float beta = 0.0f;
  const float* bias = nullptr;
};

// C tile (mr, n) at c (row stride ldc) <- store(A~ micro-panel (kc, mr) x B~ micro-panel
// (kc, n)). a: kc groups of mr floats (1 <= mr <= kMr); b: kc groups of 16 * nv floats, 64-byte
// aligned, nv = 2 when n > 16 else 1 (1 <= n <= kNr).
void micro_tile(int64_t kc, const float* a, int mr, const float* b, int n, float* c, int64_t ldc,
                const TileStore& store);

// A~ (mc, kc) from op(A) rows [i0, i0+mc), k [p0, p0+kc): micro-panels of kMr rows (the last
// one mc % kMr rows), each kc groups of mr floats; the panel of row q starts at out + q * kc.
void pack_a(bool trans_a, const float* A, int64_t lda, int64_t i0, int64_t mc, int64_t p0,
            int64_t kc, float* out);
// B~ (kc, nc) from op(B) k [p0, p0+kc), columns [j0, j0+nc): micro-panels of kNr columns, each
// kc groups of kNr floats (the last panel: 16 * ceil(nr / 16) floats, zero padded); the panel
// of column q starts at out + q * kc. out must be 64-byte aligned.
void pack_b(bool trans_b, const float* B, int64_t ldb, int64_t j0, int64_t nc, int64_t p0,
            int64_t kc, float* out);

}  // namespace zerod::cpu::gemm_avx512
