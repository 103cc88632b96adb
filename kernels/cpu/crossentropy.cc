#include "kernels/cpu/crossentropy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/simd_math.h"

namespace zerod::cpu {

namespace {

void check_targets(const int32_t* targets, int64_t N, int V, int Vp) {
  ZD_CHECK(V > 0 && V <= Vp, "cross-entropy vocabulary V={} must be in [1, Vp={}]", V, Vp);
  for (int64_t n = 0; n < N; ++n) {
    ZD_CHECK(targets[n] < V, "cross-entropy target {} at row {} is >= the vocabulary size {}",
             targets[n], n, V);
  }
}

float row_max(const float* x, int V) {
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd simdlen(16) reduction(max : m)
  for (int j = 0; j < V; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

}  // namespace

void crossentropy_forward(float* losses, const float* logits, const int32_t* targets, int64_t N,
                          int V, int Vp) {
  check_targets(targets, N, V, Vp);
#pragma omp parallel for schedule(static) if (N * V >= kParallelMinElems)
  for (int64_t n = 0; n < N; ++n) {
    const int32_t t = targets[n];
    if (t < 0) {
      losses[n] = 0.0f;
      continue;
    }
    const float* x = logits + n * Vp;
    const float m = row_max(x, V);
    float s = 0.0f;
#pragma omp simd simdlen(16) reduction(+ : s)
    for (int j = 0; j < V; ++j) s += exp_f32(x[j] - m);
    losses[n] = std::log(s) + (m - x[t]);  // m - x[t] is exact when both are close
  }
}

void crossentropy_fused(float* losses, float* logits_to_dlogits, const int32_t* targets, int64_t N,
                        int V, int Vp, float dloss) {
  check_targets(targets, N, V, Vp);
#pragma omp parallel for schedule(static) if (N * V >= kParallelMinElems)
  for (int64_t n = 0; n < N; ++n) {
    float* x = logits_to_dlogits + n * Vp;
    const int32_t t = targets[n];
    if (t < 0) {
      losses[n] = 0.0f;
      std::fill(x, x + Vp, 0.0f);
      continue;
    }
    const float m = row_max(x, V);
    const float xt = x[t];
    float s = 0.0f;
#pragma omp simd simdlen(16) reduction(+ : s)
    for (int j = 0; j < V; ++j) {
      const float e = exp_f32(x[j] - m);
      x[j] = e;
      s += e;
    }
    losses[n] = std::log(s) + (m - xt);
    const float scale = dloss / s;
#pragma omp simd simdlen(16)
    for (int j = 0; j < V; ++j) x[j] *= scale;
    x[t] -= dloss;
    std::fill(x + V, x + Vp, 0.0f);
  }
}

}  // namespace zerod::cpu
