#include "kernels/cpu/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/simd_math.h"

namespace zerod::cpu {

namespace {

// Row stride of the per-thread score blocks: T rounded up to a cache line of floats.
int64_t score_stride(int T) {
  return (static_cast<int64_t>(T) + 15) / 16 * 16;
}

void check_shape(int C, int NH) {
  ZD_CHECK(NH > 0 && C % NH == 0, "attention channels C={} must be a multiple of heads NH={}", C,
           NH);
}

// One (b, h) pair of the forward. S: kAttentionBlockQ x ldS scratch.
void forward_head(float* out, float* lse, const float* qkv, int T, int C, int hs, float scale,
                  float* S, int64_t ldS) {
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const float* q = qkv;
  const float* k = qkv + C;
  const float* v = qkv + 2 * static_cast<int64_t>(C);
  for (int i0 = 0; i0 < T; i0 += kAttentionBlockQ) {
    const int rows = std::min(kAttentionBlockQ, T - i0);
    const int kend = i0 + rows;  // keys [0, kend) are visible to some query of the block
    sgemm(false, true, rows, kend, hs, scale, q + i0 * C3, C3, k, C3, 0.0f, S, ldS);
    for (int r = 0; r < rows; ++r) {
      const int n = i0 + r + 1;  // visible keys of query i0 + r
      float* s = S + r * ldS;
      float mx = s[0];
#pragma omp simd simdlen(16) reduction(max : mx)
      for (int j = 0; j < n; ++j) mx = s[j] > mx ? s[j] : mx;
      float sum = 0.0f;
#pragma omp simd simdlen(16) reduction(+ : sum)
      for (int j = 0; j < n; ++j) {
        const float e = exp_f32(s[j] - mx);
        s[j] = e;
        sum += e;
      }
      const float inv = 1.0f / sum;
#pragma omp simd
      for (int j = 0; j < n; ++j) s[j] *= inv;
      std::fill(s + n, s + kend, 0.0f);
      lse[i0 + r] = mx + std::log(sum);
    }
    sgemm(false, false, rows, hs, kend, 1.0f, S, ldS, v, C3, 0.0f,
          out + static_cast<int64_t>(i0) * C, C);
  }
}

// One (b, h) pair of the backward. P, dS: kAttentionBlockQ x ldS scratch each.
void backward_head(float* dqkv, const float* dout, const float* qkv, const float* out,
                   const float* lse, int T, int C, int hs, float scale, float* P, float* dS,
                   int64_t ldS) {
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const float* q = qkv;
  const float* k = qkv + C;
  const float* v = qkv + 2 * static_cast<int64_t>(C);
  float* dq = dqkv;
  float* dk = dqkv + C;
  float* dv = dqkv + 2 * static_cast<int64_t>(C);
  for (int t = 0; t < T; ++t) {
    std::fill(dk + t * C3, dk + t * C3 + hs, 0.0f);
    std::fill(dv + t * C3, dv + t * C3 + hs, 0.0f);
  }
  for (int i0 = 0; i0 < T; i0 += kAttentionBlockQ) {
    const int rows = std::min(kAttentionBlockQ, T - i0);
    const int kend = i0 + rows;
    const float* q_blk = q + i0 * C3;
    const float* do_blk = dout + static_cast<int64_t>(i0) * C;
    // P = exp(S - lse) on the causal part, 0 above the diagonal.
    sgemm(false, true, rows, kend, hs, scale, q_blk, C3, k, C3, 0.0f, P, ldS);
    for (int r = 0; r < rows; ++r) {
      const int n = i0 + r + 1;
      float* p = P + r * ldS;
      const float l = lse[i0 + r];
#pragma omp simd simdlen(16)
      for (int j = 0; j < n; ++j) p[j] = exp_f32(p[j] - l);
      std::fill(p + n, p + kend, 0.0f);
    }
    // dV[0:kend] += P^T dO_blk
    sgemm(true, false, kend, hs, rows, 1.0f, P, ldS, do_blk, C, 1.0f, dv, C3);
    // dP = dO_blk V^T, then dS = P * (dP - D) in place.
    sgemm(false, true, rows, kend, hs, 1.0f, do_blk, C, v, C3, 0.0f, dS, ldS);
    for (int r = 0; r < rows; ++r) {
      const int n = i0 + r + 1;
      const float* g = do_blk + static_cast<int64_t>(r) * C;
      const float* o = out + static_cast<int64_t>(i0 + r) * C;
      float D = 0.0f;
#pragma omp simd reduction(+ : D)
      for (int c = 0; c < hs; ++c) D += g[c] * o[c];
      const float* p = P + r * ldS;
      float* ds = dS + r * ldS;
#pragma omp simd
      for (int j = 0; j < n; ++j) ds[j] = p[j] * (ds[j] - D);
      std::fill(ds + n, ds + kend, 0.0f);
    }
    // dQ_blk = scale dS K[0:kend] (overwrite); dK[0:kend] += scale dS^T Q_blk.
    sgemm(false, false, rows, hs, kend, scale, dS, ldS, k, C3, 0.0f, dq + i0 * C3, C3);
    sgemm(true, false, kend, hs, rows, scale, dS, ldS, q_blk, C3, 1.0f, dk, C3);
  }
}

}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
  check_shape(C, NH);
  if (B == 0 || T == 0) return;
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t ldS = score_stride(T);
  const int64_t per_thread = kAttentionBlockQ * ldS;
  const int tasks = B * NH;
  const int threads = std::max(1, std::min(omp_get_max_threads(), tasks));
  float* scratch = thread_scratch(static_cast<size_t>(threads * per_thread));
  const int64_t C3 = 3 * static_cast<int64_t>(C);
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    float* S = scratch + omp_get_thread_num() * per_thread;
#pragma omp for schedule(static)
    for (int task = 0; task < tasks; ++task) {
      const int b = task / NH;
      const int h = task % NH;
      forward_head(out + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * hs,
                   lse + static_cast<int64_t>(task) * T,
                   qkv + static_cast<int64_t>(b) * T * C3 + static_cast<int64_t>(h) * hs, T, C, hs,
                   scale, S, ldS);
    }
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int B, int T, int C, int NH) {
  check_shape(C, NH);
  if (B == 0 || T == 0) return;
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t ldS = score_stride(T);
  const int64_t per_thread = 2 * kAttentionBlockQ * ldS;
  const int tasks = B * NH;
  const int threads = std::max(1, std::min(omp_get_max_threads(), tasks));
  float* scratch = thread_scratch(static_cast<size_t>(threads * per_thread));
  const int64_t C3 = 3 * static_cast<int64_t>(C);
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    float* P = scratch + omp_get_thread_num() * per_thread;
    float* dS = P + kAttentionBlockQ * ldS;
#pragma omp for schedule(static)
    for (int task = 0; task < tasks; ++task) {
      const int b = task / NH;
      const int h = task % NH;
      const int64_t bt = static_cast<int64_t>(b) * T;
      backward_head(dqkv + bt * C3 + static_cast<int64_t>(h) * hs,
                    dout + bt * C + static_cast<int64_t>(h) * hs,
                    qkv + bt * C3 + static_cast<int64_t>(h) * hs,
                    out + bt * C + static_cast<int64_t>(h) * hs,
                    lse + static_cast<int64_t>(task) * T, T, C, hs, scale, P, dS, ldS);
    }
  }
}

}  // namespace zerod::cpu
