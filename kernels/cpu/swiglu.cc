#include "kernels/cpu/swiglu.h"

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/simd_math.h"

namespace zerod::cpu {

void swiglu_forward(float* out, const float* gu, int64_t N, int I) {
#pragma omp parallel for schedule(static) if (N * I >= kParallelMinElems)
  for (int64_t r = 0; r < N; ++r) {
    const float* gate = gu + r * 2 * I;
    const float* up = gate + I;
    float* o = out + r * I;
#pragma omp simd simdlen(16)
    for (int i = 0; i < I; ++i) {
      const float x = gate[i];
      const float sig = 1.0f / (1.0f + exp_f32(-x));
      o[i] = x * sig * up[i];
    }
  }
}

void swiglu_backward(float* dgu, const float* dout, const float* gu, int64_t N, int I) {
#pragma omp parallel for schedule(static) if (N * I >= kParallelMinElems)
  for (int64_t r = 0; r < N; ++r) {
    const float* gate = gu + r * 2 * I;
    const float* up = gate + I;
    const float* g = dout + r * I;
    float* dgate = dgu + r * 2 * I;
    float* dup = dgate + I;
#pragma omp simd simdlen(16)
    for (int i = 0; i < I; ++i) {
      const float x = gate[i], u = up[i], d = g[i];
      const float sig = 1.0f / (1.0f + exp_f32(-x));
      const float silu = x * sig;
      dgate[i] = d * u * (sig * (1.0f + x * (1.0f - sig)));
      dup[i] = d * silu;
    }
  }
}

}  // namespace zerod::cpu
