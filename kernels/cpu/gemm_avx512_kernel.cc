// The AVX-512 micro-kernels of the SGEMM engine. A (mr, 16*nv) tile of C lives in zmm
// accumulators; per k, the B~ row (16*nv floats) is loaded once and each A~ value is broadcast
// and multiplied into its row with FMAs. The full 14 x 32 tile (28 accumulators, 2 B vectors,
// 2 broadcast registers: all 32 zmm) is inline assembly because compilers spill it; edge tiles
// use intrinsics. Every variant accumulates an element as acc = fma(a[k], b[k], acc) from
// acc = 0 with k ascending and stores it through the same store_tile(), so a C element gets the
// same bits whichever variant computes it.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/gemm_avx512.h"
#include "kernels/cpu/gemm_avx512_target.h"

// Compiled for AVX-512 whatever the build's -march: only called on a CPU with AVX-512F.
// Everything here has internal linkage except micro_tile().
ZD_AVX512_BEGIN

namespace zerod::cpu::gemm_avx512 {
namespace {

static_assert(kMr == 14 && kNr == 32, "the assembly kernel is written for 14 x 32 tiles");

inline __mmask16 lanes(int n) {
  return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// Separately rounded multiply and add. The plain intrinsics are vector arithmetic to GCC, which
// may contract a multiply and a following add into one FMA in some instantiations and not in
// others; the explicit-rounding forms are opaque, so every variant stores the same bits.
inline __m512 mul(__m512 a, __m512 b) {
  return _mm512_mul_round_ps(a, b, _MM_FROUND_CUR_DIRECTION);
}
inline __m512 add(__m512 a, __m512 b) {
  return _mm512_add_round_ps(a, b, _MM_FROUND_CUR_DIRECTION);
}

// C (MR, n) at c = alpha * acc + beta * C (+ bias): C is read only when beta != 0.
template <int MR, int NV>
inline void store_tile(const __m512 (&acc)[MR][NV], float* c, int64_t ldc, int n,
                       const TileStore& st) {
  __mmask16 mask[NV];
  __m512 bias[NV];
#pragma GCC unroll 2
  for (int v = 0; v < NV; ++v) {
    mask[v] = lanes(n - 16 * v);
    bias[v] =
        st.bias != nullptr ? _mm512_maskz_loadu_ps(mask[v], st.bias + 16 * v) : _mm512_setzero_ps();
  }
  const __m512 alpha = _mm512_set1_ps(st.alpha);
  const __m512 beta = _mm512_set1_ps(st.beta);
  const bool scale = st.alpha != 1.0f;
  const bool add_bias = st.bias != nullptr;
#pragma GCC unroll 14
  for (int r = 0; r < MR; ++r) {
    float* row = c + r * ldc;
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) {
      __m512 x = acc[r][v];
      if (scale) x = mul(x, alpha);
      if (st.beta == 1.0f) {
        x = add(x, _mm512_maskz_loadu_ps(mask[v], row + 16 * v));
      } else if (st.beta != 0.0f) {
        x = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(mask[v], row + 16 * v), x);
      }
      if (add_bias) x = add(x, bias[v]);
      _mm512_mask_storeu_ps(row + 16 * v, mask[v], x);
    }
  }
}

// Edge tiles: MR <= 12 rows (so the accumulators fit in registers), A~ rows a_stride apart.
template <int MR, int NV>
void edge_kernel(int64_t kc, const float* __restrict a, int64_t a_stride, const float* __restrict b,
                 float* c, int64_t ldc, int n, const TileStore& st) {
  __m512 acc[MR][NV];
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
#pragma GCC unroll 2
  for (int64_t k = 0; k < kc; ++k) {
    __m512 bv[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_load_ps(b + 16 * v);
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r) {
      const __m512 av = _mm512_set1_ps(a[r]);
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
    a += a_stride;
    b += 16 * NV;
  }
  store_tile<MR, NV>(acc, c, ldc, n, st);
}

using EdgeKernel = void (*)(int64_t, const float*, int64_t, const float*, float*, int64_t, int,
                            const TileStore&);

template <int... Ms>
constexpr auto make_edge_table(std::integer_sequence<int, Ms...>) {
  struct Table {
    EdgeKernel k[2][sizeof...(Ms)];
  } t{{{&edge_kernel<Ms + 1, 1>...}, {&edge_kernel<Ms + 1, 2>...}}};
  return t;
}
constexpr int kEdgeRows = 12;
constexpr auto kEdge = make_edge_table(std::make_integer_sequence<int, kEdgeRows>());

// One k step of the 14 x 32 tile: B~ row in zmm28/29, A~ values broadcast into zmm30/31
// (alternating, so consecutive rows do not wait on one register), accumulators zmm0..27.
// clang-format off
#define ZD_ROW(koff, r, t, c0, c1)                                  \
  "vbroadcastss " #koff "*56+" #r "*4(%[a]), %%zmm" #t "\n\t"       \
  "vfmadd231ps %%zmm" #t ", %%zmm28, %%zmm" #c0 "\n\t"              \
  "vfmadd231ps %%zmm" #t ", %%zmm29, %%zmm" #c1 "\n\t"
#define ZD_K(koff)                                                  \
  "vmovaps " #koff "*128(%[b]), %%zmm28\n\t"                        \
  "vmovaps " #koff "*128+64(%[b]), %%zmm29\n\t"                     \
  ZD_ROW(koff, 0, 30, 0, 1)   ZD_ROW(koff, 1, 31, 2, 3)             \
  ZD_ROW(koff, 2, 30, 4, 5)   ZD_ROW(koff, 3, 31, 6, 7)             \
  ZD_ROW(koff, 4, 30, 8, 9)   ZD_ROW(koff, 5, 31, 10, 11)           \
  ZD_ROW(koff, 6, 30, 12, 13) ZD_ROW(koff, 7, 31, 14, 15)           \
  ZD_ROW(koff, 8, 30, 16, 17) ZD_ROW(koff, 9, 31, 18, 19)           \
  ZD_ROW(koff, 10, 30, 20, 21) ZD_ROW(koff, 11, 31, 22, 23)         \
  ZD_ROW(koff, 12, 30, 24, 25) ZD_ROW(koff, 13, 31, 26, 27)
#define ZD_ZERO(i) "vpxord %%zmm" #i ", %%zmm" #i ", %%zmm" #i "\n\t"
#define ZD_SAVE(i) "vmovaps %%zmm" #i ", " #i "*64(%[out])\n\t"
#define ZD_ALL28(M)                                                              \
  M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11) M(12) M(13)      \
  M(14) M(15) M(16) M(17) M(18) M(19) M(20) M(21) M(22) M(23) M(24) M(25) M(26) M(27)

// acc (14, 32) = A~ panel (kc, 14) x B~ panel (kc, 32), written to out (28 zmm, row-major).
void full_kernel_acc(int64_t kc, const float* a, const float* b, __m512 (&out)[14][2]) {
  int64_t k4 = kc >> 2;  // 4 k steps per loop iteration
  int64_t k1 = kc & 3;   // then one at a time
  asm volatile(
      ZD_ALL28(ZD_ZERO)
      "test %[k4], %[k4]\n\t"
      "jz 2f\n\t"
      ".p2align 5\n"
      "1:\n\t"
      ZD_K(0) ZD_K(1) ZD_K(2) ZD_K(3)
      "add $224, %[a]\n\t"
      "add $512, %[b]\n\t"
      "dec %[k4]\n\t"
      "jnz 1b\n"
      "2:\n\t"
      "test %[k1], %[k1]\n\t"
      "jz 4f\n"
      "3:\n\t"
      ZD_K(0)
      "add $56, %[a]\n\t"
      "add $128, %[b]\n\t"
      "dec %[k1]\n\t"
      "jnz 3b\n"
      "4:\n\t"
      ZD_ALL28(ZD_SAVE)
      : [a] "+r"(a), [b] "+r"(b), [k4] "+r"(k4), [k1] "+r"(k1)
      : [out] "r"(&out[0][0])
      : "memory", "cc",
        "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7",
        "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15",
        "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23",
        "xmm24", "xmm25", "xmm26", "xmm27", "xmm28", "xmm29", "xmm30", "xmm31");
}
// clang-format on

#undef ZD_ROW
#undef ZD_K
#undef ZD_ZERO
#undef ZD_SAVE
#undef ZD_ALL28

}  // namespace

void micro_tile(int64_t kc, const float* a, int mr, const float* b, int n, float* c, int64_t ldc,
                const TileStore& store) {
  const int nv = n > 16 ? 2 : 1;
  if (mr == kMr && nv == 2) {
    // Pull the C tile towards L1 while the FMAs run.
    for (int r = 0; r < kMr; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + n - 1), _MM_HINT_T0);
    }
    __m512 acc[kMr][2];
    full_kernel_acc(kc, a, b, acc);
    store_tile<kMr, 2>(acc, c, ldc, n, store);
    return;
  }
  // Split the rows into chunks of at most kEdgeRows (13 = 7 + 6); A~ rows stay mr apart.
  const int chunks = (mr + kEdgeRows - 1) / kEdgeRows;
  int r0 = 0;
  for (int i = 0; i < chunks; ++i) {
    const int rows = (mr - r0) / (chunks - i);
    kEdge.k[nv - 1][rows - 1](kc, a + r0, mr, b, c + r0 * ldc, ldc, n, store);
    r0 += rows;
  }
}

}  // namespace zerod::cpu::gemm_avx512

ZD_AVX512_END
