// optim_simd.h's AVX2 + FMA spans: optim_simd_body.h over 8 fp32 lanes.
#include <immintrin.h>

#include "kernels/cpu/avx2_target.h"
#include "kernels/cpu/optim_simd.h"

ZD_AVX2_BEGIN

// The bodies, compiled for this ISA (their headers are included above, outside the region).
#include "kernels/cpu/optim_simd_body.h"  // NOLINT(build/include)

namespace zerod::cpu::optim_simd {

namespace {

struct V256 {
  using T = __m256;
  static constexpr int64_t kWidth = 8;
  static T set1(float x) { return _mm256_set1_ps(x); }
  static T load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, T x) { _mm256_storeu_ps(p, x); }
  static T add(T a, T b) { return _mm256_add_ps(a, b); }
  static T sub(T a, T b) { return _mm256_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static T div(T a, T b) { return _mm256_div_ps(a, b); }
  static T sqrt(T a) { return _mm256_sqrt_ps(a); }
  static T fmadd(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T sign(T x) {
    const T zero = _mm256_setzero_ps();
    const T pos = _mm256_and_ps(_mm256_cmp_ps(x, zero, _CMP_GT_OQ), _mm256_set1_ps(1.0f));
    const T neg = _mm256_and_ps(_mm256_cmp_ps(x, zero, _CMP_LT_OQ), _mm256_set1_ps(-1.0f));
    return _mm256_or_ps(pos, neg);
  }
};

}  // namespace

const Spans kAvx2 = spans<V256>();

}  // namespace zerod::cpu::optim_simd

ZD_AVX2_END
