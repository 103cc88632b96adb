// SGD, Adagrad and Lion steps over fp32 master weights (torch.optim.SGD, torch.optim.Adagrad and
// lion-pytorch / DeepSpeed FusedLion), and optimizer_update(), which runs the step of any
// OptimizerKind (Adam/AdamW through adamw.h). Each element update is defined once, here, with
// the operations of torch's CPU kernels in their order (add with alpha and mul-then-add as one
// explicit fma, as is addcmul's sum + g * g; addcdiv as separate roundings; optim.cc, where these
// are instantiated, is compiled with -ffp-contract=off), so the CPU backend, the CPU-offload
// optimizer and the CUDA kernels (kernels/cuda/optim.cu) agree bit for bit.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/dtype.h"
#include "kernels/backend.h"
#include "kernels/cpu/cast.h"
#include "kernels/cpu/parallel.h"

namespace zerod::cpu {

// Per-call constants of one step (the ones derived from lr and the step computed in double).
struct OptimConstants {
  float grad_scale, weight_decay;
  bool first;  // step == 1: SGD's buffer starts at the gradient, Adagrad's sum at initial_value
  // SGD
  float neg_lr, momentum, one_minus_dampening;
  // Adagrad: neg_clr = -lr / (1 + (step - 1) * lr_decay)
  float neg_clr, eps, initial_value;
  // Lion: decay = 1 - lr * weight_decay
  float decay, beta1, one_minus_beta1, beta2, one_minus_beta2;
};

// Throws on step < 1.
OptimConstants optim_constants(const OptimizerParams& p);

// torch.optim.SGD: g = grad * scale; g += wd * p; buf = first ? g : momentum * buf +
// (1 - dampening) * g; d = nesterov ? g + momentum * buf : buf; p -= lr * d. Without momentum,
// p -= lr * g and m is untouched.
template <bool kMomentum, bool kNesterov>
inline void sgd_element(float& p, float& m, float grad, const OptimConstants& k) {
  float g = grad * k.grad_scale;
  g = std::fma(k.weight_decay, p, g);
  if constexpr (kMomentum) {
    m = k.first ? g : std::fma(k.one_minus_dampening, g, m * k.momentum);
    g = kNesterov ? std::fma(k.momentum, m, g) : m;
  }
  p = std::fma(k.neg_lr, g, p);
}

// torch.optim.Adagrad: g = grad * scale; g += wd * p; sum = (first ? init : sum) + g * g (one
// fma, as torch's addcmul kernel compiles);
// p += (-clr * g) / (sqrt(sum) + eps).
inline void adagrad_element(float& p, float& v, float grad, const OptimConstants& k) {
  float g = grad * k.grad_scale;
  g = std::fma(k.weight_decay, p, g);
  v = std::fma(g, g, k.first ? k.initial_value : v);
  const float denom = std::sqrt(v) + k.eps;
  const float step = k.neg_clr * g;
  p = p + step / denom;
}

// Lion: p *= 1 - lr * wd; c = beta1 * m + (1 - beta1) * g; p -= lr * sign(c);
// m = beta2 * m + (1 - beta2) * g.
inline void lion_element(float& p, float& m, float grad, const OptimConstants& k) {
  const float g = grad * k.grad_scale;
  p = p * k.decay;
  const float c = std::fma(k.one_minus_beta1, g, m * k.beta1);
  const float s = c > 0.0f ? 1.0f : (c < 0.0f ? -1.0f : 0.0f);
  p = std::fma(k.neg_lr, s, p);
  m = std::fma(k.one_minus_beta2, g, m * k.beta2);
}

// The loop of every optimizer step: span(i0, len) over [0, n) in blocks of 4096 elements (OpenMP
// across blocks from kParallelMinElems), each block of master rounded into param_out (n, may be
// null) while it is still in L1/L2.
template <class Span>
void update_in_blocks(float* master, float* param_out, int64_t n, DType param_dtype,
                      const Span& span) {
  constexpr int64_t kBlock = 4096;
  const int64_t blocks = ceil_div(n, kBlock);
#pragma omp parallel for schedule(static) if (n >= kParallelMinElems)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t i0 = b * kBlock;
    const int64_t len = std::min(kBlock, n - i0);
    span(i0, len);
    if (param_out != nullptr) cast_round(param_out + i0, master + i0, len, param_dtype);
  }
}

// master, m, v (n) updated in place from grad (n) * grad_scale by the step of p.kind.
// param_out (n, may be null) = the new master rounded to `param_dtype` (bf16/fp16 values stored
// as fp32; fp32: a copy).
void optimizer_update(float* master, float* m, float* v, const float* grad, float* param_out,
                      int64_t n, const OptimizerParams& p, DType param_dtype);

}  // namespace zerod::cpu
