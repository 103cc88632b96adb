#include "kernels/cpu/adamw.h"

#include <algorithm>
#include <atomic>

#include "core/cpu_info.h"
#include "core/error.h"
#include "kernels/cpu/adamw_simd.h"
#include "kernels/cpu/optim.h"

namespace zerod::cpu {

AdamWConstants adamw_constants(const AdamWParams& p) {
  ZD_CHECK(!p.bias_correction || p.step >= 1, "AdamW step {} must be >= 1 with bias correction",
           p.step);
  // Every hyperparameter rounded to fp32 first (DeepSpeed's fp32 arithmetic).
  const float lr = static_cast<float>(p.lr), beta1 = static_cast<float>(p.beta1),
              beta2 = static_cast<float>(p.beta2);
  AdamWConstants k{};
  k.lr = lr;
  k.neg_lr = -lr;
  k.beta1 = beta1;
  k.beta2 = beta2;
  k.one_minus_beta1 = 1.0f - beta1;
  k.one_minus_beta2 = 1.0f - beta2;
  k.eps = static_cast<float>(p.eps);
  k.weight_decay = static_cast<float>(p.weight_decay);
  k.grad_scale = p.grad_scale;
  double bc1 = 1.0, bc2 = 1.0;
  if (p.bias_correction) {
    const double step = static_cast<double>(p.step);
    bc1 = 1.0 - std::pow(static_cast<double>(beta1), step);
    bc2 = 1.0 - std::pow(static_cast<double>(beta2), step);
  }
  k.bias_correction1 = static_cast<float>(bc1);
  k.sqrt_bias_correction2 = static_cast<float>(std::sqrt(bc2));
  k.l2_decay = !p.adam_w_mode && k.weight_decay != 0.0f;
  k.decoupled_decay = p.adam_w_mode && k.weight_decay != 0.0f;
  return k;
}

namespace {

std::atomic<AdamIsa> g_requested{AdamIsa::kAuto};

AdamIsa resolve(AdamIsa isa) {
  if (isa != AdamIsa::kAuto) return isa;
  const CpuInfo& c = cpu_info();
  if (c.avx512f) return AdamIsa::kAvx512;
  if (c.avx2 && c.fma) return AdamIsa::kAvx2;
  return AdamIsa::kScalar;
}

template <bool kL2, bool kDecoupled>
void scalar_loop(float* master, float* m, float* v, const float* grad, int64_t n,
                 const AdamWConstants& k) {
  for (int64_t i = 0; i < n; ++i) adamw_element<kL2, kDecoupled>(master[i], m[i], v[i], grad[i], k);
}

void scalar_span(float* master, float* m, float* v, const float* grad, int64_t n,
                 const AdamWConstants& k) {
  if (k.l2_decay) {
    scalar_loop<true, false>(master, m, v, grad, n, k);
  } else if (k.decoupled_decay) {
    scalar_loop<false, true>(master, m, v, grad, n, k);
  } else {
    scalar_loop<false, false>(master, m, v, grad, n, k);
  }
}

}  // namespace

void set_adamw_isa(AdamIsa isa) {
  const CpuInfo& c = cpu_info();
  if ((isa == AdamIsa::kAvx512 && !c.avx512f) || (isa == AdamIsa::kAvx2 && !(c.avx2 && c.fma))) {
    ZD_THROW_INPUT("AdamW path '{}' requested, but this CPU ({}) does not have it",
                   adamw_isa_name(isa), c.model.empty() ? "unknown model" : c.model);
  }
  g_requested.store(isa);
}

AdamIsa adamw_isa() {
  return resolve(g_requested.load());
}

const char* adamw_isa_name(AdamIsa isa) {
  switch (isa) {
    case AdamIsa::kAuto:
      return "auto";
    case AdamIsa::kAvx512:
      return "avx512";
    case AdamIsa::kAvx2:
      return "avx2";
    case AdamIsa::kScalar:
      return "scalar";
  }
  return "?";
}

void adamw_update_span(float* master, float* m, float* v, const float* grad, int64_t n,
                       const AdamWConstants& k) {
  int64_t done = 0;
  switch (adamw_isa()) {
    case AdamIsa::kAvx512:
      done = adamw_simd::span_avx512(master, m, v, grad, n, k);
      break;
    case AdamIsa::kAvx2:
      done = adamw_simd::span_avx2(master, m, v, grad, n, k);
      break;
    default:
      break;
  }
  scalar_span(master + done, m + done, v + done, grad + done, n - done, k);
}

void adamw_update(float* master, float* m, float* v, const float* grad, float* param_out, int64_t n,
                  const AdamWParams& p, DType param_dtype) {
  const AdamWConstants k = adamw_constants(p);
  update_in_blocks(master, param_out, n, param_dtype, [&](int64_t i0, int64_t len) {
    adamw_update_span(master + i0, m + i0, v + i0, grad + i0, len, k);
  });
}

}  // namespace zerod::cpu
