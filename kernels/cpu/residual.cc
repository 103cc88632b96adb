#include "kernels/cpu/residual.h"

#include "kernels/cpu/parallel.h"

namespace zerod::cpu {

void residual_forward(float* out, const float* a, const float* b, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMinElems)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

}  // namespace zerod::cpu
