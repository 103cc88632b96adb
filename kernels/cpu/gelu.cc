#include "kernels/cpu/gelu.h"

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/simd_math.h"

namespace zerod::cpu {

namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;
}  // namespace

void gelu_forward(float* out, const float* inp, int64_t n) {
#pragma omp parallel for simd simdlen(16) schedule(static) if (n >= kParallelMinElems)
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
    out[i] = 0.5f * x * (1.0f + tanh_f32(u));
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
#pragma omp parallel for simd simdlen(16) schedule(static) if (n >= kParallelMinElems)
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
    const float t = tanh_f32(u);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
    const float grad = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
    dinp[i] = grad * dout[i];
  }
}

}  // namespace zerod::cpu
