#include "kernels/cpu/attention_block.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/simd_math.h"

namespace zerod::cpu {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Row stride of the per-thread score blocks: n rounded up to a cache line of floats.
int64_t score_stride(int64_t n) {
  return std::max<int64_t>(16, (n + 15) / 16 * 16);
}

inline bool visible(int32_t qp, int32_t kp, int window) {
  return kp <= qp && (window <= 0 || static_cast<int64_t>(kp) > static_cast<int64_t>(qp) - window);
}

// Key columns [begin, end) of the block; begin == end: none.
struct KeyRange {
  int begin = 0, end = 0;
  int size() const { return end - begin; }
};

// Where the visible keys of the call lie: per query row, the columns from its first to its last
// visible key (inside, keys may still be hidden when the key positions are not sorted); per query
// block of kAttentionBlockQ rows, the union of its rows' ranges.
struct VisibleKeys {
  std::vector<KeyRange> rows;
  std::vector<KeyRange> blocks;
  int widest = 0;  // the widest block range
};

VisibleKeys find_visible_keys(const int32_t* qpos, int Tq, const int32_t* kpos, int Tk,
                              int window) {
  VisibleKeys v;
  v.rows.resize(static_cast<size_t>(Tq));
  const bool sorted = std::is_sorted(kpos, kpos + Tk);
  for (int i = 0; i < Tq; ++i) {
    const int64_t qp = qpos[i];
    int lo = Tk, hi = 0;
    if (sorted) {
      // Keys with positions in (qp - W, qp]: [first above qp - W, first above qp).
      lo = window > 0 ? static_cast<int>(std::upper_bound(kpos, kpos + Tk, qp - window) - kpos) : 0;
      hi = static_cast<int>(std::upper_bound(kpos, kpos + Tk, qp) - kpos);
    } else {
      for (int j = 0; j < Tk; ++j) {
        if (visible(qpos[i], kpos[j], window)) {
          lo = std::min(lo, j);
          hi = j + 1;
        }
      }
    }
    if (lo < hi) v.rows[static_cast<size_t>(i)] = KeyRange{lo, hi};
  }
  for (int i0 = 0; i0 < Tq; i0 += kAttentionBlockQ) {
    KeyRange b{Tk, 0};
    for (int i = i0; i < std::min(Tq, i0 + kAttentionBlockQ); ++i) {
      const KeyRange& r = v.rows[static_cast<size_t>(i)];
      if (r.size() <= 0) continue;
      b.begin = std::min(b.begin, r.begin);
      b.end = std::max(b.end, r.end);
    }
    if (b.size() <= 0) b = KeyRange{};
    v.blocks.push_back(b);
    v.widest = std::max(v.widest, b.size());
  }
  return v;
}

void check_block_args(const char* op, const AttentionShape& s, int Tk) {
  check_attention_shape(s);
  ZD_CHECK(Tk >= 0, "{}: negative key count Tk={}", op, Tk);
  ZD_CHECK(s.doc_start == nullptr, "{}: document masking (doc_start) is not supported", op);
}

// The forward of one (b, h) pair. q (Tq rows, stride ldq), k and v (Tk rows, stride ldkv): the
// head's views; out (stride ldo) and lse (Tq) are merged into. Scratch: S (kAttentionBlockQ x
// ldS), O (kAttentionBlockQ x hs), m and l (kAttentionBlockQ each).
struct ForwardArgs {
  const int32_t* qpos;
  const int32_t* kpos;
  const VisibleKeys* keys;
  int Tq, window, hs;
  float scale;
  bool first;
  int64_t ldq, ldkv, ldo, ldS;
};

void forward_head(const ForwardArgs& a, float* out, float* lse, const float* q, const float* k,
                  const float* v, float* S, float* O, float* m, float* l) {
  const int hs = a.hs;
  for (int i0 = 0, blk = 0; i0 < a.Tq; i0 += kAttentionBlockQ, ++blk) {
    const int rows = std::min(kAttentionBlockQ, a.Tq - i0);
    const KeyRange kr = a.keys->blocks[static_cast<size_t>(blk)];
    const int ncols = kr.size();
    if (ncols > 0) {
      sgemm(false, true, rows, ncols, hs, a.scale, q + i0 * a.ldq, a.ldq, k + kr.begin * a.ldkv,
            a.ldkv, 0.0f, S, a.ldS);
    }
    for (int r = 0; r < rows; ++r) {
      const int i = i0 + r;
      const KeyRange rr = a.keys->rows[static_cast<size_t>(i)];
      float* srow = S + r * a.ldS;
      m[r] = kNegInf;
      l[r] = 0.0f;
      if (rr.size() <= 0) {
        if (ncols > 0) std::fill(srow, srow + ncols, 0.0f);
        continue;
      }
      const int lo = rr.begin - kr.begin;
      const int hi = rr.end - kr.begin;
      const int32_t qp = a.qpos[i];
      const int32_t* kp = a.kpos + kr.begin;
      float* s = srow + lo;
      const int n = hi - lo;
      for (int j = 0; j < n; ++j) {
        if (!visible(qp, kp[lo + j], a.window)) s[j] = kNegInf;
      }
      float mx = kNegInf;  // finite: the keys at lo and hi - 1 are visible
#pragma omp simd simdlen(16) reduction(max : mx)
      for (int j = 0; j < n; ++j) mx = s[j] > mx ? s[j] : mx;
      float sum = 0.0f;
#pragma omp simd simdlen(16) reduction(+ : sum)
      for (int j = 0; j < n; ++j) {
        const float e = exp_f32(s[j] - mx);  // 0 for the hidden keys (-inf)
        s[j] = e;
        sum += e;
      }
      std::fill(srow, s, 0.0f);
      std::fill(srow + hi, srow + ncols, 0.0f);
      m[r] = mx;
      l[r] = sum;
    }
    if (ncols > 0) {
      sgemm(false, false, rows, hs, ncols, 1.0f, S, a.ldS, v + kr.begin * a.ldkv, a.ldkv, 0.0f, O,
            hs);
    }
    // Merge the block's rows into out and lse (online softmax).
    for (int r = 0; r < rows; ++r) {
      const int i = i0 + r;
      float* o = out + i * a.ldo;
      const float* ob = O + r * hs;
      float& L = lse[i];
      if (l[r] == 0.0f) {  // the row sees no key of this block
        if (a.first) {
          std::fill(o, o + hs, 0.0f);
          L = kNegInf;
        }
        continue;
      }
      const float lb = m[r] + std::log(l[r]);
      if (a.first || L == kNegInf) {
        const float inv = 1.0f / l[r];
        for (int c = 0; c < hs; ++c) o[c] = ob[c] * inv;
        L = lb;
        continue;
      }
      const float hi = std::max(L, lb);
      const float merged = hi + std::log1p(std::exp(-std::fabs(L - lb)));
      const float keep = std::exp(L - merged);
      const float take = std::exp(m[r] - merged);  // = exp(lb - merged) / l
      for (int c = 0; c < hs; ++c) o[c] = o[c] * keep + ob[c] * take;
      L = merged;
    }
  }
}

// The backward of one query head against the block. q, dq (stride ldq: views of qkv and dqkv),
// k, v, dk, dv (stride ldkv: views of kv and dkv), dout, out (stride ldo), lse (Tq). dq, dk and dv
// are accumulated (+=). Scratch: P, dS (kAttentionBlockQ x ldS each).
struct BackwardArgs {
  const int32_t* qpos;
  const int32_t* kpos;
  const VisibleKeys* keys;
  int Tq, window, hs;
  float scale;
  int64_t ldq, ldkv, ldo, ldS;
};

void backward_head(const BackwardArgs& a, float* dq, float* dk, float* dv, const float* q,
                   const float* k, const float* v, const float* dout, const float* out,
                   const float* lse, float* P, float* dS) {
  const int hs = a.hs;
  for (int i0 = 0, blk = 0; i0 < a.Tq; i0 += kAttentionBlockQ, ++blk) {
    const int rows = std::min(kAttentionBlockQ, a.Tq - i0);
    const KeyRange kr = a.keys->blocks[static_cast<size_t>(blk)];
    const int ncols = kr.size();
    if (ncols <= 0) continue;
    const float* q_blk = q + i0 * a.ldq;
    const float* do_blk = dout + i0 * a.ldo;
    const float* k_blk = k + kr.begin * a.ldkv;
    const float* v_blk = v + kr.begin * a.ldkv;
    // P = exp(S - lse) on the visible pairs, 0 elsewhere.
    sgemm(false, true, rows, ncols, hs, a.scale, q_blk, a.ldq, k_blk, a.ldkv, 0.0f, P, a.ldS);
    for (int r = 0; r < rows; ++r) {
      const int i = i0 + r;
      const KeyRange rr = a.keys->rows[static_cast<size_t>(i)];
      float* prow = P + r * a.ldS;
      const float L = lse[i];
      if (rr.size() <= 0 || L == kNegInf) {
        std::fill(prow, prow + ncols, 0.0f);
        continue;
      }
      const int lo = rr.begin - kr.begin;
      const int hi = rr.end - kr.begin;
      const int32_t qp = a.qpos[i];
      const int32_t* kp = a.kpos + kr.begin;
      float* p = prow + lo;
      const int n = hi - lo;
      for (int j = 0; j < n; ++j) {
        if (!visible(qp, kp[lo + j], a.window)) p[j] = kNegInf;
      }
#pragma omp simd simdlen(16)
      for (int j = 0; j < n; ++j) p[j] = exp_f32(p[j] - L);
      std::fill(prow, p, 0.0f);
      std::fill(prow + hi, prow + ncols, 0.0f);
    }
    // dV[block] += P^T dO
    sgemm(true, false, ncols, hs, rows, 1.0f, P, a.ldS, do_blk, a.ldo, 1.0f, dv + kr.begin * a.ldkv,
          a.ldkv);
    // dP = dO V^T, then dS = P * (dP - D) in place (0 where P is).
    sgemm(false, true, rows, ncols, hs, 1.0f, do_blk, a.ldo, v_blk, a.ldkv, 0.0f, dS, a.ldS);
    for (int r = 0; r < rows; ++r) {
      const int i = i0 + r;
      const float* g = do_blk + r * a.ldo;
      const float* o = out + i * a.ldo;
      float D = 0.0f;
#pragma omp simd reduction(+ : D)
      for (int c = 0; c < hs; ++c) D += g[c] * o[c];
      const float* p = P + r * a.ldS;
      float* ds = dS + r * a.ldS;
#pragma omp simd
      for (int j = 0; j < ncols; ++j) ds[j] = p[j] * (ds[j] - D);
    }
    // dQ_blk += scale dS K[block]; dK[block] += scale dS^T Q_blk.
    sgemm(false, false, rows, hs, ncols, a.scale, dS, a.ldS, k_blk, a.ldkv, 1.0f, dq + i0 * a.ldq,
          a.ldq);
    sgemm(true, false, ncols, hs, rows, a.scale, dS, a.ldS, q_blk, a.ldq, 1.0f,
          dk + kr.begin * a.ldkv, a.ldkv);
  }
}

}  // namespace

void attention_block_forward(float* out, float* lse, const float* qkv, const int32_t* qpos,
                             const float* kv, const int32_t* kpos, int Tk, const AttentionShape& s,
                             bool first_block) {
  check_block_args("attention_block_forward", s, Tk);
  if (s.B == 0 || s.T == 0) return;
  const int Tq = s.T, NH = s.NH, KVH = s.KVH, hs = s.HS, group = s.NH / s.KVH;
  const VisibleKeys keys = find_visible_keys(qpos, Tq, kpos, Tk, s.window);
  ForwardArgs a{};
  a.qpos = qpos;
  a.kpos = kpos;
  a.keys = &keys;
  a.Tq = Tq;
  a.window = s.window;
  a.hs = hs;
  a.scale = 1.0f / std::sqrt(static_cast<float>(hs));
  a.first = first_block;
  a.ldq = s.qkv_row();
  a.ldkv = int64_t{2} * KVH * hs;
  a.ldo = s.out_row();
  a.ldS = score_stride(keys.widest);
  const int64_t per_thread = kAttentionBlockQ * (a.ldS + hs + 2);
  const int tasks = s.B * NH;
  const int threads = std::max(1, std::min(omp_get_max_threads(), tasks));
  float* scratch = thread_scratch(static_cast<size_t>(threads * per_thread));
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    float* S = scratch + omp_get_thread_num() * per_thread;
    float* O = S + kAttentionBlockQ * a.ldS;
    float* m = O + kAttentionBlockQ * hs;
    float* l = m + kAttentionBlockQ;
#pragma omp for schedule(static)
    for (int task = 0; task < tasks; ++task) {
      const int b = task / NH;
      const int h = task % NH;
      const int g = h / group;
      const float* kv0 = kv + static_cast<int64_t>(b) * Tk * a.ldkv;
      forward_head(a, out + static_cast<int64_t>(b) * Tq * a.ldo + static_cast<int64_t>(h) * hs,
                   lse + static_cast<int64_t>(task) * Tq,
                   qkv + static_cast<int64_t>(b) * Tq * a.ldq + static_cast<int64_t>(h) * hs,
                   kv0 + static_cast<int64_t>(g) * hs, kv0 + static_cast<int64_t>(KVH + g) * hs, S,
                   O, m, l);
    }
  }
}

void attention_block_backward(float* dqkv, float* dkv, const float* dout, const float* qkv,
                              const int32_t* qpos, const float* kv, const int32_t* kpos, int Tk,
                              const float* out, const float* lse, const AttentionShape& s,
                              bool accumulate_dkv) {
  check_block_args("attention_block_backward", s, Tk);
  const int Tq = s.T, NH = s.NH, KVH = s.KVH, hs = s.HS, group = s.NH / s.KVH;
  const int64_t ldkv = int64_t{2} * KVH * hs;
  if (!accumulate_dkv && s.B > 0 && Tk > 0) {
    std::fill(dkv, dkv + static_cast<int64_t>(s.B) * Tk * ldkv, 0.0f);
  }
  if (s.B == 0 || Tq == 0 || Tk == 0) return;
  const VisibleKeys keys = find_visible_keys(qpos, Tq, kpos, Tk, s.window);
  BackwardArgs a{};
  a.qpos = qpos;
  a.kpos = kpos;
  a.keys = &keys;
  a.Tq = Tq;
  a.window = s.window;
  a.hs = hs;
  a.scale = 1.0f / std::sqrt(static_cast<float>(hs));
  a.ldq = s.qkv_row();
  a.ldkv = ldkv;
  a.ldo = s.out_row();
  a.ldS = score_stride(keys.widest);
  const int64_t per_thread = 2 * kAttentionBlockQ * a.ldS;
  // One task per (b, kv head): its query heads run in order on one thread, so the dK/dV sums
  // over the shared head neither race nor depend on the thread count.
  const int tasks = s.B * KVH;
  const int threads = std::max(1, std::min(omp_get_max_threads(), tasks));
  float* scratch = thread_scratch(static_cast<size_t>(threads * per_thread));
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    float* P = scratch + omp_get_thread_num() * per_thread;
    float* dS = P + kAttentionBlockQ * a.ldS;
#pragma omp for schedule(static)
    for (int task = 0; task < tasks; ++task) {
      const int b = task / KVH;
      const int g = task % KVH;
      const int64_t bq = static_cast<int64_t>(b) * Tq;
      const int64_t bk = static_cast<int64_t>(b) * Tk * ldkv;
      const int64_t koff = static_cast<int64_t>(g) * hs;
      const int64_t voff = static_cast<int64_t>(KVH + g) * hs;
      for (int h = g * group; h < (g + 1) * group; ++h) {
        const int64_t qoff = static_cast<int64_t>(h) * hs;
        backward_head(a, dqkv + bq * a.ldq + qoff, dkv + bk + koff, dkv + bk + voff,
                      qkv + bq * a.ldq + qoff, kv + bk + koff, kv + bk + voff,
                      dout + bq * a.ldo + qoff, out + bq * a.ldo + qoff,
                      lse + (static_cast<int64_t>(b) * NH + h) * Tq, P, dS);
      }
    }
  }
}

}  // namespace zerod::cpu
