#include "kernels/cpu/adamw.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>

#include "core/error.h"
#include "kernels/cpu/cast.h"
#include "kernels/cpu/parallel.h"

namespace zerod::cpu {

AdamWConstants adamw_constants(const AdamWParams& p) {
  ZD_CHECK(!p.bias_correction || p.step >= 1, "AdamW step {} must be >= 1 with bias correction",
           p.step);
  AdamWConstants k{};
  k.lr = p.lr;
  k.neg_lr = -p.lr;
  k.beta1 = p.beta1;
  k.beta2 = p.beta2;
  k.one_minus_beta1 = 1.0f - p.beta1;
  k.one_minus_beta2 = 1.0f - p.beta2;
  k.eps = p.eps;
  k.weight_decay = p.weight_decay;
  k.grad_scale = p.grad_scale;
  double bc1 = 1.0, bc2 = 1.0;
  if (p.bias_correction) {
    const double step = static_cast<double>(p.step);
    bc1 = 1.0 - std::pow(static_cast<double>(p.beta1), step);
    bc2 = 1.0 - std::pow(static_cast<double>(p.beta2), step);
  }
  k.bias_correction1 = static_cast<float>(bc1);
  k.sqrt_bias_correction2 = static_cast<float>(std::sqrt(bc2));
  k.l2_decay = !p.adam_w_mode && p.weight_decay != 0.0f;
  k.decoupled_decay = p.adam_w_mode && p.weight_decay != 0.0f;
  return k;
}

namespace {

#if defined(__AVX512F__)
// _mm512_sqrt_ps's undefined pass-through operand trips GCC 12's -Wmaybe-uninitialized; the
// all-lanes masked form is the same instruction.
inline __m512 sqrt16(__m512 x) {
  return _mm512_maskz_sqrt_ps(static_cast<__mmask16>(0xffff), x);
}
#endif

template <bool kL2, bool kDecoupled>
void span_loop(float* master, float* m, float* v, const float* grad, int64_t n,
               const AdamWConstants& k) {
  int64_t i = 0;
#if defined(__AVX512F__)
  // adamw_element, 16 lanes at a time: the same operations in the same order.
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
  for (; i + 16 <= n; i += 16) {
    __m512 p = _mm512_loadu_ps(master + i);
    __m512 mm = _mm512_loadu_ps(m + i);
    __m512 vv = _mm512_loadu_ps(v + i);
    __m512 g = _mm512_mul_ps(_mm512_loadu_ps(grad + i), grad_scale);
    if constexpr (kL2) g = _mm512_fmadd_ps(wd, p, g);
    mm = _mm512_fmadd_ps(b1, mm, _mm512_mul_ps(omb1, g));
    vv = _mm512_fmadd_ps(b2, vv, _mm512_mul_ps(_mm512_mul_ps(omb2, g), g));
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(sqrt16(vv), sbc2), eps);
    __m512 update = _mm512_div_ps(_mm512_div_ps(mm, bc1), denom);
    if constexpr (kDecoupled) update = _mm512_fmadd_ps(wd, p, update);
    p = _mm512_fmadd_ps(neg_lr, update, p);
    _mm512_storeu_ps(master + i, p);
    _mm512_storeu_ps(m + i, mm);
    _mm512_storeu_ps(v + i, vv);
  }
#endif
  for (; i < n; ++i) adamw_element<kL2, kDecoupled>(master[i], m[i], v[i], grad[i], k);
}

}  // namespace

void adamw_update_span(float* master, float* m, float* v, const float* grad, int64_t n,
                       const AdamWConstants& k) {
  if (k.l2_decay) {
    span_loop<true, false>(master, m, v, grad, n, k);
  } else if (k.decoupled_decay) {
    span_loop<false, true>(master, m, v, grad, n, k);
  } else {
    span_loop<false, false>(master, m, v, grad, n, k);
  }
}

void adamw_update(float* master, float* m, float* v, const float* grad, float* param_out, int64_t n,
                  const AdamWParams& p, DType param_dtype) {
  const AdamWConstants k = adamw_constants(p);
  constexpr int64_t kBlock = 4096;  // param_out is written while the block is still in L1/L2
  const int64_t blocks = ceil_div(n, kBlock);
#pragma omp parallel for schedule(static) if (n >= kParallelMinElems)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t i0 = b * kBlock;
    const int64_t len = std::min(kBlock, n - i0);
    adamw_update_span(master + i0, m + i0, v + i0, grad + i0, len, k);
    if (param_out != nullptr) cast_round(param_out + i0, master + i0, len, param_dtype);
  }
}

}  // namespace zerod::cpu
