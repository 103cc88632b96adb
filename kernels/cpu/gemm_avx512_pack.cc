// Packing for the AVX-512 SGEMM engine: copies a block of op(A) or op(B) into the panel layout
// the micro-kernel streams (gemm_avx512.h), absorbing transposes and leading dimensions.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/gemm_avx512.h"
#include "kernels/cpu/gemm_avx512_target.h"

// Compiled for AVX-512 whatever the build's -march: only called on a CPU with AVX-512F.
ZD_AVX512_BEGIN

namespace zerod::cpu::gemm_avx512 {
namespace {

inline __mmask16 lanes(int64_t n) {
  return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// r[t] (16 floats each) := its transpose: afterwards r[c] holds column c of the input.
inline void transpose16(__m512 (&r)[16]) {
  __m512 t[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // Now r[4i+j], 128-bit lane L, holds column 4L+j of rows 4i..4i+3.
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    r[4 * i + 0] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const __m512 u0 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x44);
    const __m512 u1 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xEE);
    const __m512 u2 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x44);
    const __m512 u3 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xEE);
    t[j] = _mm512_shuffle_f32x4(u0, u2, 0x88);
    t[4 + j] = _mm512_shuffle_f32x4(u0, u2, 0xDD);
    t[8 + j] = _mm512_shuffle_f32x4(u1, u3, 0x88);
    t[12 + j] = _mm512_shuffle_f32x4(u1, u3, 0xDD);
  }
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

// out[k * stride + r] = src[r * ld + k] for k < kc and r < width, where rows r >= `rows` (<= 16)
// are zeros. width == 16 (full, 64-byte aligned stores: out and stride multiples of 16 floats)
// or width == rows (masked stores, for A~ panels of fewer than 16 rows).
void pack_transposed(const float* src, int64_t ld, int rows, int64_t kc, float* out, int64_t stride,
                     int width) {
  const __mmask16 out_mask = lanes(width);
  for (int64_t k0 = 0; k0 < kc; k0 += 16) {
    const __mmask16 in_mask = lanes(kc - k0);
    __m512 r[16];
#pragma GCC unroll 16
    for (int t = 0; t < 16; ++t)
      r[t] = t < rows ? _mm512_maskz_loadu_ps(in_mask, src + t * ld + k0) : _mm512_setzero_ps();
    transpose16(r);
    const int64_t kn = std::min<int64_t>(16, kc - k0);
    float* dst = out + k0 * stride;
    if (width == 16) {
#pragma GCC unroll 16
      for (int c = 0; c < 16; ++c)
        if (c < kn) _mm512_store_ps(dst + c * stride, r[c]);
    } else {
#pragma GCC unroll 16
      for (int c = 0; c < 16; ++c)
        if (c < kn) _mm512_mask_storeu_ps(dst + c * stride, out_mask, r[c]);
    }
  }
}

}  // namespace

// Rows of k handled per sweep over the panels when the source is read along rows of k: each
// sweep reads kChunk nearly contiguous row pieces, instead of a page-strided column per panel.
constexpr int64_t kChunk = 16;

void pack_a(bool trans_a, const float* A, int64_t lda, int64_t i0, int64_t mc, int64_t p0,
            int64_t kc, float* out) {
  if (trans_a) {
    // op(A)[i, k] = A[k * lda + i]: each k of a panel is mr contiguous floats.
    for (int64_t k0 = 0; k0 < kc; k0 += kChunk) {
      const int64_t k1 = std::min(kc, k0 + kChunk);
      for (int64_t q = 0; q < mc; q += kMr) {
        const int mr = static_cast<int>(std::min<int64_t>(kMr, mc - q));
        const __mmask16 m = lanes(mr);
        const float* src = A + p0 * lda + i0 + q;
        float* panel = out + q * kc;
        for (int64_t k = k0; k < k1; ++k)
          _mm512_mask_storeu_ps(panel + k * mr, m, _mm512_maskz_loadu_ps(m, src + k * lda));
      }
    }
    return;
  }
  // op(A)[i, k] = A[i * lda + k]: rows of a panel are transposed 16 k at a time.
  for (int64_t q = 0; q < mc; q += kMr) {
    const int mr = static_cast<int>(std::min<int64_t>(kMr, mc - q));
    pack_transposed(A + (i0 + q) * lda + p0, lda, mr, kc, out + q * kc, mr, mr);
  }
}

void pack_b(bool trans_b, const float* B, int64_t ldb, int64_t j0, int64_t nc, int64_t p0,
            int64_t kc, float* out) {
  if (trans_b) {
    // op(B)[k, j] = B[j * ldb + k]: each 16-column half of a panel is a transposed block.
    for (int64_t q = 0; q < nc; q += kNr) {
      const int nr = static_cast<int>(std::min<int64_t>(kNr, nc - q));
      const int nv = (nr + 15) / 16;
      for (int v = 0; v < nv; ++v) {
        pack_transposed(B + (j0 + q + 16 * v) * ldb + p0, ldb, std::min(16, nr - 16 * v), kc,
                        out + q * kc + 16 * v, 16 * nv, 16);
      }
    }
    return;
  }
  // op(B)[k, j] = B[k * ldb + j]: each k of a panel is nr contiguous floats, zero padded to a
  // multiple of 16.
  for (int64_t k0 = 0; k0 < kc; k0 += kChunk) {
    const int64_t k1 = std::min(kc, k0 + kChunk);
    for (int64_t q = 0; q < nc; q += kNr) {
      const int nr = static_cast<int>(std::min<int64_t>(kNr, nc - q));
      const float* src = B + p0 * ldb + j0 + q;
      float* panel = out + q * kc;
      if (nr > 16) {
        const __mmask16 m1 = lanes(nr - 16);
        for (int64_t k = k0; k < k1; ++k) {
          _mm512_store_ps(panel + k * 32, _mm512_loadu_ps(src + k * ldb));
          _mm512_store_ps(panel + k * 32 + 16, _mm512_maskz_loadu_ps(m1, src + k * ldb + 16));
        }
      } else {
        const __mmask16 m0 = lanes(nr);
        for (int64_t k = k0; k < k1; ++k)
          _mm512_store_ps(panel + k * 16, _mm512_maskz_loadu_ps(m0, src + k * ldb));
      }
    }
  }
}

}  // namespace zerod::cpu::gemm_avx512

ZD_AVX512_END
