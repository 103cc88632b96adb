#include "kernels/cpu/crossentropy.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "kernels/cpu/cast.h"
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

// Throws unless 0 <= real <= Vl and no target falls in this shard's padding columns
// [v0 + real, v0 + Vl) (such a target is >= the vocabulary size).
void check_shard(const int32_t* targets, int64_t N, int real, int Vl, int v0) {
  ZD_CHECK(Vl > 0 && real >= 0 && real <= Vl && v0 >= 0,
           "cross-entropy shard: real={} must be in [0, Vl={}], v0={} >= 0", real, Vl, v0);
  if (targets == nullptr) return;
  const int64_t lo = int64_t{v0} + real, hi = int64_t{v0} + Vl;
  for (int64_t n = 0; n < N; ++n) {
    ZD_CHECK(targets[n] < lo || targets[n] >= hi,
             "cross-entropy target {} at row {} is in the padding of the shard [{}, {}) (real {}): "
             ">= the vocabulary size",
             targets[n], n, v0, hi, real);
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
                        int V, int Vp, float dloss, DType round_to, uint16_t* dlogits_bf16) {
  check_targets(targets, N, V, Vp);
  ZD_CHECK(dlogits_bf16 == nullptr || round_to == DType::kBF16,
           "crossentropy_fused: bf16 dlogits need round_to bf16, not {}", dtype_name(round_to));
  const bool rounding = round_to != DType::kF32;
#pragma omp parallel for schedule(static) if (N * V >= kParallelMinElems)
  for (int64_t n = 0; n < N; ++n) {
    float* x = logits_to_dlogits + n * Vp;
    const int32_t t = targets[n];
    if (t < 0) {
      losses[n] = 0.0f;
      std::fill(x, x + Vp, 0.0f);
      if (dlogits_bf16 != nullptr) std::fill(dlogits_bf16 + n * Vp, dlogits_bf16 + (n + 1) * Vp, 0);
      continue;
    }
    if (rounding) cast_round_serial(x, x, V, round_to);  // (the padding columns are zeroed below)
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
    if (rounding) cast_round_serial(x, x, V, round_to);
    if (dlogits_bf16 != nullptr) {  // (bf16 values: their bits are the fp32 bits' upper half)
      uint16_t* o = dlogits_bf16 + n * Vp;
#pragma omp simd simdlen(16)
      for (int j = 0; j < Vp; ++j)
        o[j] = static_cast<uint16_t>(std::bit_cast<uint32_t>(x[j]) >> 16);
    }
  }
}

void crossentropy_shard_stats(float* stats, const float* logits, const int32_t* targets, int64_t N,
                              int real, int Vl, int v0) {
  check_shard(targets, N, real, Vl, v0);
#pragma omp parallel for schedule(static) if (N * real >= kParallelMinElems)
  for (int64_t n = 0; n < N; ++n) {
    const float* x = logits + n * Vl;
    stats[n] = row_max(x, real);  // -inf when real == 0
    const int64_t j = int64_t{targets[n]} - v0;
    stats[N + n] = targets[n] >= 0 && j >= 0 && j < real ? x[j] : 0.0f;
  }
}

void crossentropy_shard_sumexp(float* stats, const float* logits, int64_t N, int real, int Vl) {
  check_shard(nullptr, N, real, Vl, 0);
#pragma omp parallel for schedule(static) if (N * real >= kParallelMinElems)
  for (int64_t n = 0; n < N; ++n) {
    const float* x = logits + n * Vl;
    const float m = stats[n];
    float s = 0.0f;
#pragma omp simd simdlen(16) reduction(+ : s)
    for (int j = 0; j < real; ++j) s += exp_f32(x[j] - m);
    stats[2 * N + n] = s;
  }
}

void crossentropy_shard_finish(float* losses, float* logits_to_dlogits, const int32_t* targets,
                               const float* stats, int64_t N, int real, int Vl, int v0,
                               float dloss) {
  check_shard(targets, N, real, Vl, v0);
#pragma omp parallel for schedule(static) if (N * real >= kParallelMinElems)
  for (int64_t n = 0; n < N; ++n) {
    float* x = logits_to_dlogits + n * Vl;
    const int32_t t = targets[n];
    if (t < 0) {
      losses[n] = 0.0f;
      std::fill(x, x + Vl, 0.0f);
      continue;
    }
    const float m = stats[n], xt = stats[N + n], s = stats[2 * N + n];
    losses[n] = std::log(s) + (m - xt);  // as crossentropy_fused
    const float scale = dloss / s;
#pragma omp simd simdlen(16)
    for (int j = 0; j < real; ++j) x[j] = exp_f32(x[j] - m) * scale;
    const int64_t j = int64_t{t} - v0;
    if (j >= 0 && j < real) x[j] -= dloss;
    std::fill(x + real, x + Vl, 0.0f);
  }
}

}  // namespace zerod::cpu
