#include "kernels/cpu/rmsnorm.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/parallel.h"

namespace zerod::cpu {

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t N,
                     int C, float eps) {
  const float inv_c = 1.0f / static_cast<float>(C);
#pragma omp parallel for schedule(static) if (N * C >= kParallelMinElems)
  for (int64_t r = 0; r < N; ++r) {
    const float* x = inp + r * C;
    float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
    for (int c = 0; c < C; ++c) sq += x[c] * x[c];
    const float s = 1.0f / std::sqrt(sq * inv_c + eps);
    float* o = out + r * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] = (x[c] * s) * weight[c];
    rstd[r] = s;
  }
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int64_t N, int C) {
  if (N == 0 || C == 0) return;
  const float inv_c = 1.0f / static_cast<float>(C);
  const int64_t chunk_rows = reduction_chunk_rows(N);
  const int64_t chunks = ceil_div(N, chunk_rows);
  // partial[k] = the dweight part (C) of chunk k.
  float* partial = thread_scratch(static_cast<size_t>(chunks) * C);
  const bool par = N * C >= kParallelMinElems;

#pragma omp parallel if (par)
  {
#pragma omp for schedule(static)
    for (int64_t k = 0; k < chunks; ++k) {
      float* pw = partial + k * C;
      std::fill(pw, pw + C, 0.0f);
      const int64_t r_end = std::min(N, (k + 1) * chunk_rows);
      for (int64_t r = k * chunk_rows; r < r_end; ++r) {
        const float* x = inp + r * C;
        const float* g = dout + r * C;
        const float s = rstd[r];
        float dnn_sum = 0.0f;
#pragma omp simd reduction(+ : dnn_sum)
        for (int c = 0; c < C; ++c) dnn_sum += weight[c] * g[c] * (x[c] * s);
        const float dnn_mean = dnn_sum * inv_c;
        float* di = dinp + r * C;
#pragma omp simd
        for (int c = 0; c < C; ++c) {
          const float norm = x[c] * s;
          di[c] += s * (weight[c] * g[c] - norm * dnn_mean);
          pw[c] += norm * g[c];
        }
      }
    }
    // Combine the chunk partials in chunk order, partitioned by channel.
    constexpr int kBlock = 64;
#pragma omp for schedule(static)
    for (int cb = 0; cb < C; cb += kBlock) {
      const int cn = std::min(kBlock, C - cb);
      float aw[kBlock] = {};
      for (int64_t k = 0; k < chunks; ++k) {
        const float* pw = partial + k * C + cb;
#pragma omp simd
        for (int c = 0; c < cn; ++c) aw[c] += pw[c];
      }
#pragma omp simd
      for (int c = 0; c < cn; ++c) dweight[cb + c] += aw[c];
    }
  }
}

}  // namespace zerod::cpu
