#include "kernels/cpu/lamb.h"

#include <vector>

#include "core/error.h"
#include "kernels/cpu/optim.h"
#include "kernels/cpu/optim_simd.h"

namespace zerod {

// A backend without Lamb's two passes (the CPU and CUDA backends have them).
Backend::LambSums Backend::lamb_moments(float*, float*, float*, const void*, int64_t,
                                        const OptimizerParams&) {
  ZD_THROW("the {} backend has no Lamb optimizer", name());
}
void Backend::lamb_apply(float*, const float*, const float*, void*, int64_t, const OptimizerParams&,
                         float) {
  ZD_THROW("the {} backend has no Lamb optimizer", name());
}

namespace cpu {

LambConstants lamb_constants(const OptimizerParams& p) {
  ZD_CHECK(p.step >= 1, "optimizer step {} must be >= 1", p.step);
  auto f = [](double x) { return static_cast<float>(x); };
  LambConstants k{};
  k.grad_scale = p.grad_scale;
  k.beta1 = f(p.beta1);
  k.beta2 = f(p.beta2);
  k.one_minus_beta1 = 1.0f - k.beta1;
  k.one_minus_beta2 = 1.0f - k.beta2;
  k.eps = f(p.eps);
  k.weight_decay = f(p.weight_decay);
  k.max_coeff = f(p.max_coeff);
  k.min_coeff = f(p.min_coeff);
  k.eps_inside_sqrt = p.eps_inside_sqrt;
  const float lr = f(p.lr);
  k.step_size = lr;
  if (p.bias_correction) {
    const double step = static_cast<double>(p.step);
    const float bc1 = f(1.0 - std::pow(static_cast<double>(k.beta1), step));
    const float bc2 = f(1.0 - std::pow(static_cast<double>(k.beta2), step));
    k.step_size = lr * std::sqrt(bc2) / bc1;
  }
  return k;
}

float lamb_coeff(double w2, double u2, const LambConstants& k) {
  const double w = std::sqrt(w2), u = std::sqrt(u2);
  if (w == 0.0 || u == 0.0) return 1.0f;
  float c = static_cast<float>(w / u);
  if (c > k.max_coeff) c = k.max_coeff;
  if (c < k.min_coeff) c = k.min_coeff;
  return c;
}

namespace {
constexpr int64_t kBlock = 4096;
}  // namespace

Backend::LambSums lamb_moments(float* master, float* m, float* v, const float* grad, int64_t n,
                               const OptimizerParams& p) {
  const LambConstants k = lamb_constants(p);
  const optim_simd::Spans* simd = optim_simd::current();
  const int64_t blocks = ceil_div(n, kBlock);
  std::vector<Backend::LambSums> part(static_cast<size_t>(blocks));
#pragma omp parallel for schedule(static) if (n >= kParallelMinElems)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t i0 = b * kBlock, i1 = std::min(n, i0 + kBlock);
    // The block's directions (the vector span's; the scalar tail's), then the sums in element
    // order: the same double sums on every path.
    float u[kBlock];
    int64_t d = 0;
    if (simd != nullptr)
      d = simd->lamb_moments(master + i0, m + i0, v + i0, grad + i0, u, i1 - i0, k);
    for (int64_t i = i0 + d; i < i1; ++i)
      u[i - i0] = lamb_moments_element(master[i], m[i], v[i], grad[i], k);
    double w2 = 0, u2 = 0;
    for (int64_t i = i0; i < i1; ++i) {
      w2 += static_cast<double>(master[i]) * master[i];
      u2 += static_cast<double>(u[i - i0]) * u[i - i0];
    }
    part[static_cast<size_t>(b)] = {w2, u2};
  }
  Backend::LambSums s;
  for (const Backend::LambSums& q : part) {
    s.w2 += q.w2;
    s.u2 += q.u2;
  }
  return s;
}

void lamb_apply(float* master, const float* m, const float* v, float* param_out, int64_t n,
                const OptimizerParams& p, float coeff, DType param_dtype) {
  const LambConstants k = lamb_constants(p);
  const float scaled = k.step_size * coeff;
  const optim_simd::Spans* simd = optim_simd::current();
  update_in_blocks(master, param_out, n, param_dtype, [&](int64_t i0, int64_t len) {
    const int64_t d =
        simd != nullptr ? simd->lamb_apply(master + i0, m + i0, v + i0, len, scaled, k) : 0;
    for (int64_t i = i0 + d; i < i0 + len; ++i)
      master[i] = master[i] - scaled * lamb_direction(master[i], m[i], v[i], k);
  });
}

}  // namespace cpu
}  // namespace zerod
