#include "kernels/cpu/optim.h"

#include "core/error.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cpu/optim_simd.h"

namespace zerod::cpu {

// Each constant as torch makes it: the scalar (or its expression, in double) rounded to fp32.
OptimConstants optim_constants(const OptimizerParams& p) {
  ZD_CHECK(p.step >= 1, "optimizer step {} must be >= 1", p.step);
  auto f = [](double x) { return static_cast<float>(x); };
  OptimConstants k{};
  k.grad_scale = p.grad_scale;
  k.weight_decay = f(p.weight_decay);
  k.first = p.step == 1;
  k.neg_lr = f(-p.lr);
  k.momentum = f(p.momentum);
  k.one_minus_dampening = f(1.0 - p.dampening);
  k.neg_clr = f(-(p.lr / (1.0 + static_cast<double>(p.step - 1) * p.lr_decay)));
  k.eps = f(p.eps);
  k.initial_value = f(p.initial_accumulator_value);
  k.decay = f(1.0 - p.lr * p.weight_decay);
  k.beta1 = f(p.beta1);
  k.one_minus_beta1 = f(1.0 - p.beta1);
  k.beta2 = f(p.beta2);
  k.one_minus_beta2 = f(1.0 - p.beta2);
  return k;
}

namespace optim_simd {

const Spans* current() {
  switch (adamw_isa()) {
    case AdamIsa::kAvx512:
      return &kAvx512;
    case AdamIsa::kAvx2:
      return &kAvx2;
    default:
      return nullptr;
  }
}

}  // namespace optim_simd

namespace {

template <bool kMomentum, bool kNesterov>
void sgd_loop(float* master, float* m, const float* grad, int64_t n, const OptimConstants& k) {
  for (int64_t i = 0; i < n; ++i) sgd_element<kMomentum, kNesterov>(master[i], m[i], grad[i], k);
}

// One block of the step of p.kind (Adam excluded): the vector span of the CPU's ISA
// (optim_simd.h), then the scalar elements for the tail (or all of it on the scalar path).
void span(float* master, float* m, float* v, const float* grad, int64_t n, const OptimizerParams& p,
          const OptimConstants& k, const optim_simd::Spans* simd) {
  using optim_simd::SgdVariant;
  int64_t d = 0;
  switch (p.kind) {
    case OptimizerKind::kSgd: {
      const SgdVariant variant = p.momentum == 0.0 ? SgdVariant::kPlain
                                 : p.nesterov      ? SgdVariant::kNesterov
                                                   : SgdVariant::kMomentum;
      if (simd != nullptr) d = simd->sgd(master, m, grad, n, k, variant);
      if (variant == SgdVariant::kPlain) {
        sgd_loop<false, false>(master + d, m + d, grad + d, n - d, k);
      } else if (variant == SgdVariant::kNesterov) {
        sgd_loop<true, true>(master + d, m + d, grad + d, n - d, k);
      } else {
        sgd_loop<true, false>(master + d, m + d, grad + d, n - d, k);
      }
      break;
    }
    case OptimizerKind::kAdagrad:
      if (simd != nullptr) d = simd->adagrad(master, v, grad, n, k);
      for (int64_t i = d; i < n; ++i) adagrad_element(master[i], v[i], grad[i], k);
      break;
    case OptimizerKind::kLion:
      if (simd != nullptr) d = simd->lion(master, m, grad, n, k);
      for (int64_t i = d; i < n; ++i) lion_element(master[i], m[i], grad[i], k);
      break;
    case OptimizerKind::kAdam:
    case OptimizerKind::kMuon:
    case OptimizerKind::kLamb:
      break;
  }
}

}  // namespace

void optimizer_update(float* master, float* m, float* v, const float* grad, float* param_out,
                      int64_t n, const OptimizerParams& p, DType param_dtype) {
  if (p.kind == OptimizerKind::kAdam) {
    adamw_update(master, m, v, grad, param_out, n, p, param_dtype);
    return;
  }
  ZD_CHECK(p.kind != OptimizerKind::kMuon,
           "Muon is not an elementwise step (ZeroEngine orthogonalises its matrices)");
  ZD_CHECK(p.kind != OptimizerKind::kLamb,
           "Lamb has no one-pass step (lamb_moments and lamb_apply, zero/lamb_step.cc)");
  const OptimConstants k = optim_constants(p);
  const optim_simd::Spans* simd = optim_simd::current();
  update_in_blocks(master, param_out, n, param_dtype, [&](int64_t i0, int64_t len) {
    span(master + i0, m + i0, v + i0, grad + i0, len, p, k, simd);
  });
}

}  // namespace zerod::cpu
