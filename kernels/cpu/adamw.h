// AdamW / Adam (L2) step over fp32 master weights, the formula of DeepSpeed's FusedAdam.
//
// The element update is defined once, here, by adamw_element(); adamw_update_span() is its
// vector loop, which the CPU backend uses and the CPU-offload optimizer should use too, so both
// agree bit for bit. Every multiply-add is an explicit fma and no other mul+add pair exists, so
// the result does not depend on the compiler's contraction choices or on vectorisation.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/dtype.h"
#include "kernels/backend.h"

namespace zerod::cpu {

// Per-call constants of one step, computed once (bias corrections in double).
struct AdamWConstants {
  float lr, neg_lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay;
  float grad_scale;
  float bias_correction1;       // 1 - beta1^step (or 1)
  float sqrt_bias_correction2;  // sqrt(1 - beta2^step) (or 1)
  bool l2_decay;                // !adam_w_mode && weight_decay != 0: decay added to the gradient
  bool decoupled_decay;         // adam_w_mode && weight_decay != 0: decay added to the update
};

// Throws on step < 1 with bias correction (a zero correction would divide by zero).
AdamWConstants adamw_constants(const AdamWParams& p);

// One element, fp32, for a decay mode fixed at compile time (kL2: decay added to the gradient,
// !adam_w_mode; kDecoupled: decay added to the update, adam_w_mode; neither when wd == 0):
//   g = grad * grad_scale;                     if (kL2) g = fma(wd, p, g)
//   m = fma(beta1, m, (1 - beta1) * g);        v = fma(beta2, v, ((1 - beta2) * g) * g)
//   denom = sqrt(v) / sqrt(bc2) + eps;         update = (m / bc1) / denom
//   if (kDecoupled) update = fma(wd, p, update)
//   p = fma(-lr, update, p)
template <bool kL2, bool kDecoupled>
inline void adamw_element(float& p, float& m, float& v, float grad, const AdamWConstants& k) {
  float g = grad * k.grad_scale;
  if constexpr (kL2) g = std::fma(k.weight_decay, p, g);
  m = std::fma(k.beta1, m, k.one_minus_beta1 * g);
  v = std::fma(k.beta2, v, (k.one_minus_beta2 * g) * g);
  const float denom = std::sqrt(v) / k.sqrt_bias_correction2 + k.eps;
  float update = (m / k.bias_correction1) / denom;
  if constexpr (kDecoupled) update = std::fma(k.weight_decay, p, update);
  p = std::fma(k.neg_lr, update, p);
}

// The vector path of adamw_update_span: chosen at run time from cpu_info() (AVX-512F, else AVX2
// + FMA, else scalar), whatever the build's -march; set_adamw_isa forces one (tests,
// benchmarks; an ISA this CPU lacks is an InputError) and kAuto restores the choice.
enum class AdamIsa { kAuto, kAvx512, kAvx2, kScalar };
void set_adamw_isa(AdamIsa isa);
AdamIsa adamw_isa();  // the path in use (kAuto resolved)
const char* adamw_isa_name(AdamIsa isa);

// master, m, v (n) updated in place from grad (n) with the constants of one step (no rounded
// copy). The AVX-512 and AVX2 paths run 16 or 8 lanes of the same IEEE operations in the same
// order (explicit intrinsics: GCC does not vectorise std::sqrt without -fno-math-errno), so
// every path equals adamw_element bit for bit.
void adamw_update_span(float* master, float* m, float* v, const float* grad, int64_t n,
                       const AdamWConstants& k);

// master, m, v (n) updated in place from grad (n) * grad_scale. param_out (n, may be null) =
// the new master rounded to `param_dtype` (bf16/fp16 values stored as fp32; fp32: a copy).
void adamw_update(float* master, float* m, float* v, const float* grad, float* param_out, int64_t n,
                  const AdamWParams& p, DType param_dtype);

}  // namespace zerod::cpu
