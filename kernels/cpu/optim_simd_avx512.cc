// optim_simd.h's AVX-512 spans: optim_simd_body.h over 16 fp32 lanes.
#include <immintrin.h>

#include "kernels/cpu/gemm_avx512_target.h"
#include "kernels/cpu/optim_simd.h"

ZD_AVX512_BEGIN

// The bodies, compiled for this ISA (their headers are included above, outside the region).
#include "kernels/cpu/optim_simd_body.h"  // NOLINT(build/include)

namespace zerod::cpu::optim_simd {

namespace {

struct V512 {
  using T = __m512;
  static constexpr int64_t kWidth = 16;
  static T set1(float x) { return _mm512_set1_ps(x); }
  static T load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, T x) { _mm512_storeu_ps(p, x); }
  static T add(T a, T b) { return _mm512_add_ps(a, b); }
  static T sub(T a, T b) { return _mm512_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static T div(T a, T b) { return _mm512_div_ps(a, b); }
  // (The all-lanes masked sqrt is _mm512_sqrt_ps without its undefined pass-through operand.)
  static T sqrt(T a) { return _mm512_maskz_sqrt_ps(static_cast<__mmask16>(0xffff), a); }
  static T fmadd(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T sign(T x) {
    const T zero = _mm512_setzero_ps();
    const __mmask16 pos = _mm512_cmp_ps_mask(x, zero, _CMP_GT_OQ);
    const __mmask16 neg = _mm512_cmp_ps_mask(x, zero, _CMP_LT_OQ);
    return _mm512_mask_mov_ps(_mm512_maskz_mov_ps(pos, _mm512_set1_ps(1.0f)), neg,
                              _mm512_set1_ps(-1.0f));
  }
};

}  // namespace

const Spans kAvx512 = spans<V512>();

}  // namespace zerod::cpu::optim_simd

ZD_AVX512_END
