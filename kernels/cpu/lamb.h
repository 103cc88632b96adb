// Lamb (DeepSpeed FusedLamb, csrc/lamb/fused_lamb_cuda_kernel.cu) over fp32 master weights, in
// the two passes of its kernel: lamb_moments (part 1: the moments, and the sums of squares of the
// weights and of the update direction) and lamb_apply (part 3: the step scaled by the tensor's
// trust ratio, the direction recomputed from the updated moments). Between them the caller sums
// the partial sums of every piece of a tensor (over ZeRO shards: zero/lamb_step.cc) and makes
// the ratio with lamb_coeff. Every constant and operation in fp32 as DeepSpeed's kernel, in its
// order, with no contraction (compiled with -ffp-contract=off), so the CUDA kernels
// (kernels/cuda/lamb.cu) agree bit for bit; the sums are accumulated in double.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/dtype.h"
#include "kernels/backend.h"

namespace zerod::cpu {

struct LambConstants {
  float grad_scale, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay;
  // lr * sqrt(1 - beta2^step) / (1 - beta1^step) with bias correction, else lr (fp32, as
  // DeepSpeed's host code: the powers in double, rounded, then fp32 arithmetic).
  float step_size;
  float max_coeff, min_coeff;
  bool eps_inside_sqrt;
};

// Throws on step < 1.
LambConstants lamb_constants(const OptimizerParams& p);

// Part 1 for one element: m, v updated; returns u = m / denom + weight_decay * p.
inline float lamb_moments_element(float p, float& m, float& v, float grad, const LambConstants& k) {
  const float g = grad * k.grad_scale;
  m = k.beta1 * m + k.one_minus_beta1 * g;
  v = k.beta2 * v + k.one_minus_beta2 * g * g;
  const float denom = k.eps_inside_sqrt ? std::sqrt(v + k.eps) : std::sqrt(v) + k.eps;
  return m / denom + k.weight_decay * p;
}

// u recomputed from the updated moments (part 3).
inline float lamb_direction(float p, float m, float v, const LambConstants& k) {
  const float denom = k.eps_inside_sqrt ? std::sqrt(v + k.eps) : std::sqrt(v) + k.eps;
  return m / denom + k.weight_decay * p;
}

// The trust ratio from a tensor's sums of squares: ||w|| / ||u|| rounded to fp32 and clamped to
// [min_coeff, max_coeff] (DeepSpeed's order: max first, then min); 1 when either norm is 0.
float lamb_coeff(double w2, double u2, const LambConstants& k);

// master, m, v (n): m, v updated from grad (n) * grad_scale; returns the sums of master^2 and u^2
// (per block of 4096 elements in order, then the blocks in order: the same for any thread count).
Backend::LambSums lamb_moments(float* master, float* m, float* v, const float* grad, int64_t n,
                               const OptimizerParams& p);

// master (n) -= step_size * coeff * u; param_out (n, may be null) = the new master rounded to
// `param_dtype` (bf16/fp16 values stored as fp32).
void lamb_apply(float* master, const float* m, const float* v, float* param_out, int64_t n,
                const OptimizerParams& p, float coeff, DType param_dtype);

}  // namespace zerod::cpu
