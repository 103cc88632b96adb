#include "kernels/cpu/layernorm.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/parallel.h"

namespace zerod::cpu {

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t N, int C) {
  const float inv_c = 1.0f / static_cast<float>(C);
#pragma omp parallel for schedule(static) if (N * C >= kParallelMinElems)
  for (int64_t r = 0; r < N; ++r) {
    const float* x = inp + r * C;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int c = 0; c < C; ++c) sum += x[c];
    const float m = sum * inv_c;
    float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
    for (int c = 0; c < C; ++c) {
      const float d = x[c] - m;
      sq += d * d;
    }
    const float s = 1.0f / std::sqrt(sq * inv_c + kLayerNormEps);
    float* o = out + r * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[r] = m;
    rstd[r] = s;
  }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int64_t N, int C) {
  if (N == 0 || C == 0) return;
  const float inv_c = 1.0f / static_cast<float>(C);
  const int64_t chunk_rows = reduction_chunk_rows(N);
  const int64_t chunks = ceil_div(N, chunk_rows);
  // partial[k] = (dweight part (C), dbias part (C)) of chunk k.
  float* partial = thread_scratch(static_cast<size_t>(chunks) * 2 * C);
  const bool par = N * C >= kParallelMinElems;

#pragma omp parallel if (par)
  {
#pragma omp for schedule(static)
    for (int64_t k = 0; k < chunks; ++k) {
      float* pw = partial + k * 2 * C;
      float* pb = pw + C;
      std::fill(pw, pw + 2 * C, 0.0f);
      const int64_t r_end = std::min(N, (k + 1) * chunk_rows);
      for (int64_t r = k * chunk_rows; r < r_end; ++r) {
        const float* x = inp + r * C;
        const float* g = dout + r * C;
        const float m = mean[r];
        const float s = rstd[r];
        float dn_sum = 0.0f, dnn_sum = 0.0f;
#pragma omp simd reduction(+ : dn_sum, dnn_sum)
        for (int c = 0; c < C; ++c) {
          const float norm = (x[c] - m) * s;
          const float dn = weight[c] * g[c];
          dn_sum += dn;
          dnn_sum += dn * norm;
        }
        const float dn_mean = dn_sum * inv_c;
        const float dnn_mean = dnn_sum * inv_c;
        float* di = dinp + r * C;
#pragma omp simd
        for (int c = 0; c < C; ++c) {
          const float norm = (x[c] - m) * s;
          const float dn = weight[c] * g[c];
          di[c] += s * (dn - dn_mean - norm * dnn_mean);
          pw[c] += norm * g[c];
          pb[c] += g[c];
        }
      }
    }
    // Combine the chunk partials in chunk order, partitioned by channel.
    constexpr int kBlock = 64;
#pragma omp for schedule(static)
    for (int cb = 0; cb < C; cb += kBlock) {
      const int cn = std::min(kBlock, C - cb);
      float aw[kBlock] = {}, ab[kBlock] = {};
      for (int64_t k = 0; k < chunks; ++k) {
        const float* pw = partial + k * 2 * C + cb;
        const float* pb = pw + C;
#pragma omp simd
        for (int c = 0; c < cn; ++c) {
          aw[c] += pw[c];
          ab[c] += pb[c];
        }
      }
#pragma omp simd
      for (int c = 0; c < cn; ++c) {
        dweight[cb + c] += aw[c];
        dbias[cb + c] += ab[c];
      }
    }
  }
}

}  // namespace zerod::cpu
