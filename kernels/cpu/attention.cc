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

// Row stride of the per-thread score blocks: n rounded up to a cache line of floats.
int64_t score_stride(int64_t n) {
  return (n + 15) / 16 * 16;
}

// The first key position visible to query position p (keys [first_key, p] are visible): the
// window's first key, and with document masking (ds: the batch row's doc_start, indexed by
// position; null: none) not before p's document. Both bounds are non-decreasing in p, so the
// first row of a query block gives the block's first key.
inline int first_key(int p, int window, const int32_t* ds) {
  const int w = window > 0 ? std::max(0, p - window + 1) : 0;
  return ds != nullptr ? std::max(w, static_cast<int>(ds[p])) : w;
}

// The most keys one query block of a sequence of T positions touches.
int64_t max_block_keys(int64_t T, int window) {
  return window > 0 ? std::min<int64_t>(T, int64_t{kAttentionBlockQ} + window - 1) : T;
}

// Query rows of one (b, h) pair of the forward. q (Tq rows, stride ldq) holds the queries at
// positions pos0 .. pos0+Tq-1; k, v (stride ldkv) hold the keys and values of positions 0 .. on;
// out (Tq rows, stride ldo) =; lse (Tq) = unless null. ds: doc_start of the batch row (indexed
// by position) or null. S: kAttentionBlockQ x ldS scratch.
void forward_rows(float* out, int64_t ldo, float* lse, const float* q, int64_t ldq, const float* k,
                  const float* v, int64_t ldkv, int Tq, int pos0, int window, const int32_t* ds,
                  int hs, float scale, float* S, int64_t ldS) {
  for (int i0 = 0; i0 < Tq; i0 += kAttentionBlockQ) {
    const int rows = std::min(kAttentionBlockQ, Tq - i0);
    const int p0 = pos0 + i0;
    // Keys [kbeg, kend) are visible to some query of the block; column c of S is key kbeg + c.
    const int kbeg = first_key(p0, window, ds);
    const int kend = p0 + rows;
    const int ncols = kend - kbeg;
    sgemm(false, true, rows, ncols, hs, scale, q + i0 * ldq, ldq, k + kbeg * ldkv, ldkv, 0.0f, S,
          ldS);
    for (int r = 0; r < rows; ++r) {
      const int p = p0 + r;
      const int lo = first_key(p, window, ds) - kbeg;  // visible columns [lo, hi)
      const int hi = p + 1 - kbeg;
      float* srow = S + r * ldS;
      float* s = srow + lo;
      const int n = hi - lo;
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
      std::fill(srow, s, 0.0f);
      std::fill(srow + hi, srow + ncols, 0.0f);
      if (lse != nullptr) lse[i0 + r] = mx + std::log(sum);
    }
    sgemm(false, false, rows, hs, ncols, 1.0f, S, ldS, v + kbeg * ldkv, ldkv, 0.0f, out + i0 * ldo,
          ldo);
  }
}

// One query head of the backward. q, k, v and dq, dk, dv are strided views (stride ld) of qkv
// and dqkv; dout, out have stride ldo. dq =; dk, dv += (the caller zeroes them once per kv
// head). ds: doc_start of the batch row or null. P, dS: kAttentionBlockQ x ldS scratch each.
void backward_head(float* dq, float* dk, float* dv, const float* q, const float* k, const float* v,
                   int64_t ld, const float* dout, const float* out, int64_t ldo, const float* lse,
                   int T, int window, const int32_t* ds, int hs, float scale, float* P, float* dS,
                   int64_t ldS) {
  for (int i0 = 0; i0 < T; i0 += kAttentionBlockQ) {
    const int rows = std::min(kAttentionBlockQ, T - i0);
    const int kbeg = first_key(i0, window, ds);
    const int kend = i0 + rows;
    const int ncols = kend - kbeg;
    const float* q_blk = q + i0 * ld;
    const float* do_blk = dout + i0 * ldo;
    const float* k_blk = k + kbeg * ld;
    const float* v_blk = v + kbeg * ld;
    // P = exp(S - lse) on the visible part, 0 elsewhere.
    sgemm(false, true, rows, ncols, hs, scale, q_blk, ld, k_blk, ld, 0.0f, P, ldS);
    for (int r = 0; r < rows; ++r) {
      const int i = i0 + r;
      const int lo = first_key(i, window, ds) - kbeg;
      const int hi = i + 1 - kbeg;
      float* prow = P + r * ldS;
      float* p = prow + lo;
      const int n = hi - lo;
      const float l = lse[i];
#pragma omp simd simdlen(16)
      for (int j = 0; j < n; ++j) p[j] = exp_f32(p[j] - l);
      std::fill(prow, p, 0.0f);
      std::fill(prow + hi, prow + ncols, 0.0f);
    }
    // dV[kbeg:kend] += P^T dO_blk
    sgemm(true, false, ncols, hs, rows, 1.0f, P, ldS, do_blk, ldo, 1.0f, dv + kbeg * ld, ld);
    // dP = dO_blk V^T, then dS = P * (dP - D) in place.
    sgemm(false, true, rows, ncols, hs, 1.0f, do_blk, ldo, v_blk, ld, 0.0f, dS, ldS);
    for (int r = 0; r < rows; ++r) {
      const int i = i0 + r;
      const int lo = first_key(i, window, ds) - kbeg;
      const int hi = i + 1 - kbeg;
      const float* g = do_blk + r * ldo;
      const float* o = out + i * ldo;
      float D = 0.0f;
#pragma omp simd reduction(+ : D)
      for (int c = 0; c < hs; ++c) D += g[c] * o[c];
      const float* p = P + r * ldS + lo;
      float* dsrow = dS + r * ldS;
      float* ds = dsrow + lo;
      const int n = hi - lo;
#pragma omp simd
      for (int j = 0; j < n; ++j) ds[j] = p[j] * (ds[j] - D);
      std::fill(dsrow, ds, 0.0f);
      std::fill(dsrow + hi, dsrow + ncols, 0.0f);
    }
    // dQ_blk = scale dS K[kbeg:kend] (overwrite); dK[kbeg:kend] += scale dS^T Q_blk.
    sgemm(false, false, rows, hs, ncols, scale, dS, ldS, k_blk, ld, 0.0f, dq + i0 * ld, ld);
    sgemm(true, false, ncols, hs, rows, scale, dS, ldS, q_blk, ld, 1.0f, dk + kbeg * ld, ld);
  }
}

}  // namespace

void check_attention_shape(const AttentionShape& s) {
  ZD_CHECK(s.NH > 0 && s.KVH > 0 && s.NH % s.KVH == 0,
           "attention query heads NH={} must be a positive multiple of kv heads KVH={}", s.NH,
           s.KVH);
  ZD_CHECK(s.HS > 0, "attention head size HS={} must be positive", s.HS);
  ZD_CHECK(s.B >= 0 && s.T >= 0, "attention B={} T={} must not be negative", s.B, s.T);
  ZD_CHECK(s.window >= 0, "attention window {} must not be negative", s.window);
}

void attention_forward(float* out, float* lse, const float* qkv, const AttentionShape& s) {
  check_attention_shape(s);
  if (s.B == 0 || s.T == 0) return;
  const int T = s.T, NH = s.NH, hs = s.HS, group = s.NH / s.KVH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t ldS = score_stride(max_block_keys(T, s.window));
  const int64_t per_thread = kAttentionBlockQ * ldS;
  const int tasks = s.B * NH;
  const int threads = std::max(1, std::min(omp_get_max_threads(), tasks));
  float* scratch = thread_scratch(static_cast<size_t>(threads * per_thread));
  const int64_t R = s.qkv_row();
  const int64_t ldo = s.out_row();
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    float* S = scratch + omp_get_thread_num() * per_thread;
#pragma omp for schedule(static)
    for (int task = 0; task < tasks; ++task) {
      const int b = task / NH;
      const int h = task % NH;
      const int g = h / group;
      const float* row0 = qkv + static_cast<int64_t>(b) * T * R;
      forward_rows(out + static_cast<int64_t>(b) * T * ldo + static_cast<int64_t>(h) * hs, ldo,
                   lse + static_cast<int64_t>(task) * T, row0 + static_cast<int64_t>(h) * hs, R,
                   row0 + static_cast<int64_t>(NH + g) * hs,
                   row0 + static_cast<int64_t>(NH + s.KVH + g) * hs, R, T, /*pos0=*/0, s.window,
                   s.doc_start != nullptr ? s.doc_start + static_cast<int64_t>(b) * T : nullptr, hs,
                   scale, S, ldS);
    }
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, const AttentionShape& s) {
  check_attention_shape(s);
  if (s.B == 0 || s.T == 0) return;
  const int T = s.T, NH = s.NH, KVH = s.KVH, hs = s.HS, group = s.NH / s.KVH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t ldS = score_stride(max_block_keys(T, s.window));
  const int64_t per_thread = 2 * kAttentionBlockQ * ldS;
  // One task per (b, kv head): its query heads run in order on one thread, so the dK/dV sums
  // over the shared head neither race nor depend on the thread count.
  const int tasks = s.B * KVH;
  const int threads = std::max(1, std::min(omp_get_max_threads(), tasks));
  float* scratch = thread_scratch(static_cast<size_t>(threads * per_thread));
  const int64_t R = s.qkv_row();
  const int64_t ldo = s.out_row();
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    float* P = scratch + omp_get_thread_num() * per_thread;
    float* dS = P + kAttentionBlockQ * ldS;
#pragma omp for schedule(static)
    for (int task = 0; task < tasks; ++task) {
      const int b = task / KVH;
      const int g = task % KVH;
      const int64_t bt = static_cast<int64_t>(b) * T;
      const float* x = qkv + bt * R;
      float* dx = dqkv + bt * R;
      const int64_t koff = static_cast<int64_t>(NH + g) * hs;
      const int64_t voff = static_cast<int64_t>(NH + KVH + g) * hs;
      for (int t = 0; t < T; ++t) {
        std::fill(dx + t * R + koff, dx + t * R + koff + hs, 0.0f);
        std::fill(dx + t * R + voff, dx + t * R + voff + hs, 0.0f);
      }
      for (int h = g * group; h < (g + 1) * group; ++h) {
        const int64_t qoff = static_cast<int64_t>(h) * hs;
        backward_head(dx + qoff, dx + koff, dx + voff, x + qoff, x + koff, x + voff, R,
                      dout + bt * ldo + qoff, out + bt * ldo + qoff, ldo,
                      lse + (static_cast<int64_t>(b) * NH + h) * T, T, s.window,
                      s.doc_start != nullptr ? s.doc_start + bt : nullptr, hs, scale, P, dS, ldS);
      }
    }
  }
}

void attention_kv_cache(float* out, const float* qkv, float* kcache, float* vcache, int pos0,
                        int maxT, const AttentionShape& s) {
  check_attention_shape(s);
  ZD_CHECK(s.doc_start == nullptr,
           "attention_kv_cache: document masking (doc_start) is not supported with a KV cache");
  ZD_CHECK(pos0 >= 0 && static_cast<int64_t>(pos0) + s.T <= maxT,
           "kv cache positions [{}, {}) outside the cache of {}", pos0,
           static_cast<int64_t>(pos0) + s.T, maxT);
  if (s.B == 0 || s.T == 0) return;
  const int Tq = s.T, NH = s.NH, KVH = s.KVH, hs = s.HS, group = s.NH / s.KVH;
  const int64_t R = s.qkv_row();
  const int64_t ldo = s.out_row();
  const int64_t ldkv = static_cast<int64_t>(KVH) * hs;  // a cache row: the KVH heads

  // 1. The new positions' k and v into the caches.
  const int64_t rows = static_cast<int64_t>(s.B) * Tq;
#pragma omp parallel for schedule(static) if (rows * 2 * ldkv >= kParallelMinElems)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = r / Tq, t = r % Tq;
    const float* src = qkv + r * R + static_cast<int64_t>(NH) * hs;
    const int64_t dst = (b * maxT + pos0 + t) * ldkv;
    std::copy(src, src + ldkv, kcache + dst);
    std::copy(src + ldkv, src + 2 * ldkv, vcache + dst);
  }

  // 2. Each new query over the cached positions it may see.
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t ldS = score_stride(max_block_keys(static_cast<int64_t>(pos0) + Tq, s.window));
  const int64_t per_thread = kAttentionBlockQ * ldS;
  const int tasks = s.B * NH;
  const int threads = std::max(1, std::min(omp_get_max_threads(), tasks));
  float* scratch = thread_scratch(static_cast<size_t>(threads * per_thread));
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    float* S = scratch + omp_get_thread_num() * per_thread;
#pragma omp for schedule(static)
    for (int task = 0; task < tasks; ++task) {
      const int b = task / NH;
      const int h = task % NH;
      const int g = h / group;
      const int64_t cache0 = static_cast<int64_t>(b) * maxT * ldkv + static_cast<int64_t>(g) * hs;
      forward_rows(out + static_cast<int64_t>(b) * Tq * ldo + static_cast<int64_t>(h) * hs, ldo,
                   /*lse=*/nullptr,
                   qkv + static_cast<int64_t>(b) * Tq * R + static_cast<int64_t>(h) * hs, R,
                   kcache + cache0, vcache + cache0, ldkv, Tq, pos0, s.window, /*ds=*/nullptr, hs,
                   scale, S, ldS);
    }
  }
}

}  // namespace zerod::cpu
