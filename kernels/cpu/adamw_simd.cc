#include "kernels/cpu/adamw_simd.h"

#include <immintrin.h>

#include "kernels/cpu/avx2_target.h"
#include "kernels/cpu/gemm_avx512_target.h"

namespace zerod::cpu::adamw_simd {

ZD_AVX512_BEGIN

int64_t span_avx512(float* master, float* m, float* v, const float* grad, int64_t n,
                    const AdamWConstants& k) {
  const __m512 grad_scale = _mm512_set1_ps(k.grad_scale);
  const __m512 wd = _mm512_set1_ps(k.weight_decay);
  const __m512 b1 = _mm512_set1_ps(k.beta1);
  const __m512 b2 = _mm512_set1_ps(k.beta2);
  const __m512 omb1 = _mm512_set1_ps(k.one_minus_beta1);
  const __m512 omb2 = _mm512_set1_ps(k.one_minus_beta2);
  const __m512 sbc2 = _mm512_set1_ps(k.sqrt_bias_correction2);
  const __m512 bc1 = _mm512_set1_ps(k.bias_correction1);
  const __m512 eps = _mm512_set1_ps(k.eps);
  const __m512 neg_lr = _mm512_set1_ps(k.neg_lr);
  const bool l2 = k.l2_decay, decoupled = k.decoupled_decay;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 p = _mm512_loadu_ps(master + i);
    __m512 mm = _mm512_loadu_ps(m + i);
    __m512 vv = _mm512_loadu_ps(v + i);
    __m512 g = _mm512_mul_ps(_mm512_loadu_ps(grad + i), grad_scale);
    if (l2) g = _mm512_fmadd_ps(wd, p, g);
    mm = _mm512_fmadd_ps(b1, mm, _mm512_mul_ps(omb1, g));
    vv = _mm512_fmadd_ps(b2, vv, _mm512_mul_ps(_mm512_mul_ps(omb2, g), g));
    // (The all-lanes masked sqrt is the same instruction as _mm512_sqrt_ps without its
    // undefined pass-through operand.)
    const __m512 root = _mm512_maskz_sqrt_ps(static_cast<__mmask16>(0xffff), vv);
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(root, sbc2), eps);
    __m512 update = _mm512_div_ps(_mm512_div_ps(mm, bc1), denom);
    if (decoupled) update = _mm512_fmadd_ps(wd, p, update);
    p = _mm512_fmadd_ps(neg_lr, update, p);
    _mm512_storeu_ps(master + i, p);
    _mm512_storeu_ps(m + i, mm);
    _mm512_storeu_ps(v + i, vv);
  }
  return i;
}

ZD_AVX512_END

ZD_AVX2_BEGIN

int64_t span_avx2(float* master, float* m, float* v, const float* grad, int64_t n,
                  const AdamWConstants& k) {
  const __m256 grad_scale = _mm256_set1_ps(k.grad_scale);
  const __m256 wd = _mm256_set1_ps(k.weight_decay);
  const __m256 b1 = _mm256_set1_ps(k.beta1);
  const __m256 b2 = _mm256_set1_ps(k.beta2);
  const __m256 omb1 = _mm256_set1_ps(k.one_minus_beta1);
  const __m256 omb2 = _mm256_set1_ps(k.one_minus_beta2);
  const __m256 sbc2 = _mm256_set1_ps(k.sqrt_bias_correction2);
  const __m256 bc1 = _mm256_set1_ps(k.bias_correction1);
  const __m256 eps = _mm256_set1_ps(k.eps);
  const __m256 neg_lr = _mm256_set1_ps(k.neg_lr);
  const bool l2 = k.l2_decay, decoupled = k.decoupled_decay;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 p = _mm256_loadu_ps(master + i);
    __m256 mm = _mm256_loadu_ps(m + i);
    __m256 vv = _mm256_loadu_ps(v + i);
    __m256 g = _mm256_mul_ps(_mm256_loadu_ps(grad + i), grad_scale);
    if (l2) g = _mm256_fmadd_ps(wd, p, g);
    mm = _mm256_fmadd_ps(b1, mm, _mm256_mul_ps(omb1, g));
    vv = _mm256_fmadd_ps(b2, vv, _mm256_mul_ps(_mm256_mul_ps(omb2, g), g));
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vv), sbc2), eps);
    __m256 update = _mm256_div_ps(_mm256_div_ps(mm, bc1), denom);
    if (decoupled) update = _mm256_fmadd_ps(wd, p, update);
    p = _mm256_fmadd_ps(neg_lr, update, p);
    _mm256_storeu_ps(master + i, p);
    _mm256_storeu_ps(m + i, mm);
    _mm256_storeu_ps(v + i, vv);
  }
  return i;
}

ZD_AVX2_END

}  // namespace zerod::cpu::adamw_simd
