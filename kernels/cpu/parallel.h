// Helpers shared by the CPU kernels: OpenMP thresholds, thread-count independent reduction
// chunks, and per-thread scratch memory.
//
// Determinism rule of the CPU backend: every result is a function of the inputs only, never of
// the number of OpenMP threads. Element-wise loops get this for free; a reduction over rows
// splits the rows into chunks whose size depends on the row count only, reduces each chunk
// sequentially into its own partial, and combines the partials in chunk order.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zerod::cpu {

// Vector width: GCC's tuning for recent Xeons prefers 256-bit vectors; the compute-bound loops
// (exp, tanh) say `#pragma omp simd simdlen(16)` to get 512-bit ones where AVX-512 is on.

// Element-wise loops shorter than this run on the calling thread (a parallel region costs a
// few microseconds; 1<<15 floats take about that long on one core).
constexpr int64_t kParallelMinElems = int64_t{1} << 15;

// Rows per reduction chunk for a reduction over `rows` rows: at most kMaxChunks chunks and at
// least kMinRows rows per chunk (fewer only when rows itself is smaller). Depends on `rows`
// only.
inline int64_t reduction_chunk_rows(int64_t rows) {
  constexpr int64_t kMaxChunks = 64;
  constexpr int64_t kMinRows = 16;
  const int64_t by_count = (rows + kMaxChunks - 1) / kMaxChunks;
  return by_count > kMinRows ? by_count : kMinRows;
}

inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Scratch floats owned by the calling thread, 64-byte aligned, grown on demand and kept for the
// thread's lifetime (OpenMP pool threads persist, so steady-state calls do not allocate).
// `slot` selects one of a few independent buffers so a kernel can hold several at once.
// Contents are unspecified on return.
float* thread_scratch(size_t n_floats, int slot = 0);

}  // namespace zerod::cpu
