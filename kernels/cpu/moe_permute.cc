#include "kernels/cpu/moe_permute.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/parallel.h"

namespace zerod::cpu {

int64_t moe_permute_plan(int64_t* offsets, int32_t* row_token, int32_t* slot_row,
                         const int32_t* expert, int64_t N, int k, int E) {
  ZD_CHECK(N >= 0 && k >= 1 && E >= 1, "moe_permute_plan: N {} k {} E {}", N, k, E);
  ZD_CHECK(N * k <= std::numeric_limits<int32_t>::max(),
           "moe_permute_plan: {} x {} assignments exceed the int32 row ids", N, k);
  // Counting sort by expert, stable in token order.
  std::fill(offsets, offsets + E + 1, int64_t{0});
  for (int64_t s = 0; s < N * k; ++s) {
    const int32_t e = expert[s];
    ZD_CHECK(e >= -1 && e < E, "moe_permute_plan: slot {} routes to expert {} of {}", s, e, E);
    if (e >= 0) ++offsets[e + 1];
  }
  for (int e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
  std::vector<int64_t> next(offsets, offsets + E);
  for (int64_t s = 0; s < N * k; ++s) {
    const int32_t e = expert[s];
    if (e < 0) {
      slot_row[s] = -1;
      continue;
    }
    const int64_t r = next[static_cast<size_t>(e)]++;
    slot_row[s] = static_cast<int32_t>(r);
    row_token[r] = static_cast<int32_t>(s / k);
  }
  return offsets[E];
}

void moe_permute_forward(float* xp, const float* x, const int32_t* row_token, int64_t R, int C) {
#pragma omp parallel for schedule(static) if (R * C >= kParallelMinElems)
  for (int64_t r = 0; r < R; ++r) {
    std::copy_n(x + int64_t{row_token[r]} * C, C, xp + r * C);
  }
}

void moe_permute_backward(float* dx, const float* dxp, const int32_t* slot_row, int64_t N, int k,
                          int C) {
#pragma omp parallel for schedule(static) if (N * k * C >= kParallelMinElems)
  for (int64_t n = 0; n < N; ++n) {
    float* d = dx + n * C;
    for (int j = 0; j < k; ++j) {
      const int32_t r = slot_row[n * k + j];
      if (r < 0) continue;
      const float* g = dxp + int64_t{r} * C;
#pragma omp simd
      for (int c = 0; c < C; ++c) d[c] += g[c];
    }
  }
}

void moe_unpermute_forward(float* y, const float* yp, const float* weight, const int32_t* slot_row,
                           int64_t N, int k, int C) {
#pragma omp parallel for schedule(static) if (N * k * C >= kParallelMinElems)
  for (int64_t n = 0; n < N; ++n) {
    float* out = y + n * C;
    std::fill(out, out + C, 0.0f);
    for (int j = 0; j < k; ++j) {
      const int32_t r = slot_row[n * k + j];
      if (r < 0) continue;
      const float w = weight[n * k + j];
      const float* src = yp + int64_t{r} * C;
#pragma omp simd
      for (int c = 0; c < C; ++c) out[c] += w * src[c];
    }
  }
}

void moe_unpermute_backward(float* dyp, float* dweight, const float* dy, const float* yp,
                            const float* weight, const int32_t* slot_row, int64_t N, int k, int C) {
#pragma omp parallel for schedule(static) if (N * k * C >= kParallelMinElems)
  for (int64_t n = 0; n < N; ++n) {
    const float* g = dy + n * C;
    for (int j = 0; j < k; ++j) {
      const int32_t r = slot_row[n * k + j];
      if (r < 0) {
        if (dweight != nullptr) dweight[n * k + j] = 0.0f;
        continue;
      }
      const float w = weight[n * k + j];
      float* d = dyp + int64_t{r} * C;
      const float* src = yp + int64_t{r} * C;
      double dot = 0.0;
      for (int c = 0; c < C; ++c) {
        d[c] = w * g[c];
        dot += static_cast<double>(g[c]) * src[c];
      }
      if (dweight != nullptr) dweight[n * k + j] = static_cast<float>(dot);
    }
  }
}

}  // namespace zerod::cpu
