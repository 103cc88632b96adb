#include "kernels/cpu/attention.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "kernel_test_util.h"

namespace zerod::cpu {
namespace {

using test::VecD;
using test::VecF;

// MHA shape of C channels and NH heads (GPT-2's call).
AttentionShape mha(int B, int T, int C, int NH) {
  return AttentionShape{B, T, NH, NH, C / NH, 0};
}

size_t qkv_size(const AttentionShape& s) {
  return static_cast<size_t>(s.B) * s.T * static_cast<size_t>(s.qkv_row());
}
size_t out_size(const AttentionShape& s) {
  return static_cast<size_t>(s.B) * s.T * static_cast<size_t>(s.out_row());
}

// Element offsets of q head h, k head g and v head g of row (b, t), and of out head h.
struct Idx {
  const AttentionShape& s;
  size_t row(int b, int t) const { return (static_cast<size_t>(b) * s.T + t) * s.qkv_row(); }
  size_t q(int b, int t, int h) const { return row(b, t) + static_cast<size_t>(h) * s.HS; }
  size_t k(int b, int t, int g) const { return row(b, t) + static_cast<size_t>(s.NH + g) * s.HS; }
  size_t v(int b, int t, int g) const {
    return row(b, t) + static_cast<size_t>(s.NH + s.KVH + g) * s.HS;
  }
  size_t o(int b, int t, int h) const {
    return (static_cast<size_t>(b) * s.T + t) * s.out_row() + static_cast<size_t>(h) * s.HS;
  }
  size_t lse(int b, int h, int t) const { return (static_cast<size_t>(b) * s.NH + h) * s.T + t; }
  int kv_head(int h) const { return h / (s.NH / s.KVH); }
  // Keys visible to query i of batch row b: [first(b, i), i] (window, document masking).
  int first(int b, int i) const {
    const int w = s.window > 0 ? std::max(0, i - s.window + 1) : 0;
    return s.doc_start != nullptr ? std::max(w, int{s.doc_start[static_cast<size_t>(b) * s.T + i]})
                                  : w;
  }
};

struct AttnRef {
  VecD out, lse;
};

// Causal (optionally windowed) grouped-query attention in double, straight from the definition.
AttnRef attention_ref(const VecD& qkv, const AttentionShape& s) {
  const Idx x{s};
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.HS));
  AttnRef r{VecD(out_size(s), 0.0), VecD(static_cast<size_t>(s.B) * s.NH * s.T)};
  VecD sc(s.T);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h) {
      const int g = x.kv_head(h);
      for (int i = 0; i < s.T; ++i) {
        const double* q = &qkv[x.q(b, i, h)];
        double m = -INFINITY;
        for (int j = x.first(b, i); j <= i; ++j) {
          const double* k = &qkv[x.k(b, j, g)];
          double d = 0.0;
          for (int c = 0; c < s.HS; ++c) d += q[c] * k[c];
          sc[j] = d * scale;
          m = std::max(m, sc[j]);
        }
        double sum = 0.0;
        for (int j = x.first(b, i); j <= i; ++j) sum += std::exp(sc[j] - m);
        r.lse[x.lse(b, h, i)] = m + std::log(sum);
        double* o = &r.out[x.o(b, i, h)];
        for (int j = x.first(b, i); j <= i; ++j) {
          const double p = std::exp(sc[j] - m) / sum;
          const double* v = &qkv[x.v(b, j, g)];
          for (int c = 0; c < s.HS; ++c) o[c] += p * v[c];
        }
      }
    }
  return r;
}

// The gradient of sum(dout * out) with respect to qkv, in double, from the definition:
// dP = dO V^T, dS = P * (dP - rowsum(P * dP)), dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO.
VecD attention_backward_ref(const VecD& qkv, const VecD& dout, const AttentionShape& s) {
  const Idx x{s};
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.HS));
  const AttnRef fwd = attention_ref(qkv, s);
  VecD d(qkv.size(), 0.0), P(s.T), dP(s.T);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h) {
      const int g = x.kv_head(h);
      for (int i = 0; i < s.T; ++i) {
        const double* q = &qkv[x.q(b, i, h)];
        const double* go = &dout[x.o(b, i, h)];
        const double l = fwd.lse[x.lse(b, h, i)];
        double D = 0.0;
        for (int j = x.first(b, i); j <= i; ++j) {
          double qk = 0.0, gv = 0.0;
          for (int c = 0; c < s.HS; ++c) {
            qk += q[c] * qkv[x.k(b, j, g) + c];
            gv += go[c] * qkv[x.v(b, j, g) + c];
          }
          P[j] = std::exp(qk * scale - l);
          dP[j] = gv;
          D += P[j] * gv;
        }
        for (int j = x.first(b, i); j <= i; ++j) {
          const double ds = P[j] * (dP[j] - D);
          for (int c = 0; c < s.HS; ++c) {
            d[x.q(b, i, h) + c] += scale * ds * qkv[x.k(b, j, g) + c];
            d[x.k(b, j, g) + c] += scale * ds * q[c];
            d[x.v(b, j, g) + c] += P[j] * go[c];
          }
        }
      }
    }
  return d;
}

std::string describe(const AttentionShape& s) {
  return fmt::format("B={} T={} NH={} KVH={} HS={} window={}{}", s.B, s.T, s.NH, s.KVH, s.HS,
                     s.window, s.doc_start != nullptr ? " doc_start" : "");
}

// Forward (out, lse) and backward (dq, dk, dv) against the double references; with
// `finite_differences` also the backward against central differences of the forward reference
// (a check of the backward reference itself, on small shapes).
void check_attention(const AttentionShape& s, uint64_t seed, bool finite_differences = false) {
  SCOPED_TRACE(describe(s));
  const VecF qkv = test::randn(static_cast<int64_t>(qkv_size(s)), seed, 1.5f);
  VecF out(out_size(s), test::kNaN), lse(static_cast<size_t>(s.B) * s.NH * s.T, test::kNaN);
  attention_forward(out.data(), lse.data(), qkv.data(), s);
  const VecD qd = test::to_double(qkv);
  const AttnRef ref = attention_ref(qd, s);
  EXPECT_LT(test::rel_err(out, ref.out), 1e-5);
  EXPECT_LT(test::rel_err(lse, ref.lse), 1e-6);

  const VecF g = test::randn(static_cast<int64_t>(out_size(s)), seed + 1);
  const VecD gd = test::to_double(g);
  VecF dqkv(qkv.size(), test::kNaN);  // = output
  attention_backward(dqkv.data(), g.data(), qkv.data(), out.data(), lse.data(), s);
  for (float v : dqkv) ASSERT_TRUE(std::isfinite(v));  // every element written
  const VecD want = attention_backward_ref(qd, gd, s);
  // Separately for the q, k and v parts, so a wrong part cannot hide behind a larger one; a
  // part whose gradient is (near) zero, as dq and dk at T = 1, is measured against 1% of the
  // largest gradient of all.
  double scale = 0.0;
  for (double v : want) scale = std::max(scale, std::fabs(v));
  const Idx x{s};
  for (int part = 0; part < 3; ++part) {
    std::vector<size_t> idx;
    for (int b = 0; b < s.B; ++b)
      for (int t = 0; t < s.T; ++t) {
        const size_t begin = part == 0 ? x.q(b, t, 0) : part == 1 ? x.k(b, t, 0) : x.v(b, t, 0);
        const size_t n = static_cast<size_t>(part == 0 ? s.NH : s.KVH) * s.HS;
        for (size_t i = 0; i < n; ++i) idx.push_back(begin + i);
      }
    double err = 0.0, den = 1e-2 * scale;
    for (size_t i : idx) {
      err = std::max(err, std::fabs(double{dqkv[i]} - want[i]));
      den = std::max(den, std::fabs(want[i]));
    }
    EXPECT_LT(err / den, 1e-5) << "part "
                               << "qkv"[part];
  }
  if (finite_differences) {
    auto f = [&](const VecD& v) { return test::dot(gd, attention_ref(v, s).out); };
    const auto idx = test::sample_indices(qkv.size(), 300, seed);
    const VecD fd = test::fd_gradient(f, qd, idx);
    EXPECT_LT(test::rel_err(want, fd, idx), 1e-6);
    EXPECT_LT(test::rel_err(dqkv, fd, idx), 2e-5);
  }
}

TEST(Attention, SingleTokenAndSmallShapes) {
  check_attention(mha(/*B=*/1, /*T=*/1, /*C=*/6, /*NH=*/2), 200, true);
  check_attention(mha(/*B=*/2, /*T=*/5, /*C=*/12, /*NH=*/3), 210, true);
  check_attention(mha(/*B=*/3, /*T=*/7, /*C=*/5, /*NH=*/1), 220, true);
}

TEST(Attention, SequencesLongerThanTheQueryBlock) {
  static_assert(kAttentionBlockQ < 67);
  check_attention(mha(/*B=*/1, /*T=*/67, /*C=*/8, /*NH=*/2), 230);
  check_attention(mha(/*B=*/2, /*T=*/2 * kAttentionBlockQ + 3, /*C=*/12, /*NH=*/4), 240);
}

TEST(Attention, GroupedQueryHeads) {
  // {B, T, NH, KVH, HS, window}
  for (int hs : {16, 32, 64}) {
    check_attention({2, 37, 4, 2, hs, 0}, 300 + hs);
    check_attention({2, 37, 4, 1, hs, 0}, 310 + hs);
  }
  check_attention({2, 9, 6, 3, 5, 0}, 320, true);  // odd head size, 2 query heads per kv head
  check_attention({1, 6, 4, 1, 3, 0}, 325, true);  // multi-query
  check_attention({2, 2 * kAttentionBlockQ + 5, 4, 2, 16, 0}, 330);
}

TEST(Attention, SlidingWindow) {
  for (int hs : {16, 32, 64}) {
    check_attention({2, 37, 4, 2, hs, 8}, 400 + hs);
    check_attention({2, 37, 4, 1, hs, 8}, 410 + hs);
    check_attention({2, 37, 4, 4, hs, 8}, 420 + hs);
  }
  check_attention({2, 11, 4, 2, 5, 3}, 430, true);  // finite differences too
  check_attention({1, 7, 2, 1, 4, 1}, 440, true);   // each position sees only itself
  // Windows across query blocks: key ranges starting inside an earlier block.
  check_attention({2, 2 * kAttentionBlockQ + 22, 4, 2, 16, 70}, 450);
  check_attention({1, 3 * kAttentionBlockQ + 1, 2, 1, 8, kAttentionBlockQ}, 460);
  check_attention({1, 3 * kAttentionBlockQ + 1, 2, 2, 8, 5}, 470);
}

// doc_start (B,T) of rows whose documents start at the given positions (besides 0).
std::vector<int32_t> doc_starts(int T, const std::vector<std::vector<int>>& starts) {
  std::vector<int32_t> ds;
  for (const auto& row : starts) {
    int cur = 0;
    for (int t = 0; t < T; ++t) {
      if (std::find(row.begin(), row.end(), t) != row.end()) cur = t;
      ds.push_back(cur);
    }
  }
  return ds;
}

TEST(Attention, DocumentMasking) {
  // {B, T, NH, KVH, HS, window}: several documents per row (a different split per row), one of
  // a single position, documents across query blocks, with and without a window, GQA and MHA.
  struct Case {
    AttentionShape s;
    std::vector<std::vector<int>> starts;
    bool fd;
  };
  const int L = 2 * kAttentionBlockQ + 9;
  const std::vector<Case> cases = {
      {{2, 11, 4, 2, 5, 0}, {{3, 4, 8}, {6}}, true},
      {{2, 11, 4, 2, 5, 3}, {{5}, {1, 2, 9}}, true},
      {{1, 9, 2, 1, 4, 0}, {{1, 2, 3, 4, 5, 6, 7, 8}}, true},  // every position its own document
      {{2, 37, 4, 1, 16, 0}, {{10, 30}, {}}, false},
      {{2, L, 4, 2, 16, 0}, {{20, kAttentionBlockQ + 3, 2 * kAttentionBlockQ + 1}, {100}}, false},
      {{2, L, 4, 4, 8, 40}, {{kAttentionBlockQ - 1, kAttentionBlockQ + 50}, {5, 6, 7}}, false},
      {{1, L, 6, 2, 32, 70}, {{kAttentionBlockQ, kAttentionBlockQ + 1}}, false},
  };
  uint64_t seed = 600;
  for (const Case& c : cases) {
    const std::vector<int32_t> ds = doc_starts(c.s.T, c.starts);
    AttentionShape s = c.s;
    s.doc_start = ds.data();
    check_attention(s, seed++, c.fd);
  }
}

TEST(Attention, DocumentMaskingOfOneDocumentChangesNothing) {
  // doc_start all 0 gives the unmasked results bit for bit.
  AttentionShape s{2, 2 * kAttentionBlockQ + 3, 4, 2, 16, 20};
  const VecF qkv = test::randn(static_cast<int64_t>(qkv_size(s)), 700);
  const VecF g = test::randn(static_cast<int64_t>(out_size(s)), 701);
  const std::vector<int32_t> zeros(static_cast<size_t>(s.B) * s.T, 0);
  auto run = [&](const AttentionShape& a) {
    VecF out(out_size(a)), lse(static_cast<size_t>(a.B) * a.NH * a.T), d(qkv.size());
    attention_forward(out.data(), lse.data(), qkv.data(), a);
    attention_backward(d.data(), g.data(), qkv.data(), out.data(), lse.data(), a);
    return std::vector<VecF>{out, lse, d};
  };
  const auto a = run(s);
  s.doc_start = zeros.data();
  const auto b = run(s);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(test::bitwise_equal(a[i], b[i])) << i;
}

TEST(Attention, WindowOfAtLeastTIsCausal) {
  const AttentionShape causal{2, 70, 4, 2, 16, 0};
  AttentionShape wide = causal;
  wide.window = 70;
  const VecF qkv = test::randn(static_cast<int64_t>(qkv_size(causal)), 500);
  const VecF g = test::randn(static_cast<int64_t>(out_size(causal)), 501);
  auto run = [&](const AttentionShape& s) {
    VecF out(out_size(s)), lse(static_cast<size_t>(s.B) * s.NH * s.T), d(qkv.size());
    attention_forward(out.data(), lse.data(), qkv.data(), s);
    attention_backward(d.data(), g.data(), qkv.data(), out.data(), lse.data(), s);
    return std::vector<VecF>{out, lse, d};
  };
  const auto a = run(causal), b = run(wide);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(test::bitwise_equal(a[i], b[i])) << i;
  // A shorter window changes the result (the test above can fail).
  AttentionShape narrow = causal;
  narrow.window = 69;
  EXPECT_FALSE(test::bitwise_equal(run(narrow)[0], a[0]));
}

// Prefill of the first `prefill` positions, then chunks of `step` new positions at a time, each
// through attention_kv_cache, against attention_forward over the whole sequence.
void check_kv_cache(const AttentionShape& s, int prefill, int step, int maxT, uint64_t seed) {
  SCOPED_TRACE(describe(s) + fmt::format(" prefill={} step={} maxT={}", prefill, step, maxT));
  const int64_t R = s.qkv_row(), O = s.out_row(), KV = int64_t{s.KVH} * s.HS;
  const VecF qkv = test::randn(static_cast<int64_t>(qkv_size(s)), seed, 1.5f);
  VecF want(out_size(s)), lse(static_cast<size_t>(s.B) * s.NH * s.T);
  attention_forward(want.data(), lse.data(), qkv.data(), s);

  // Unwritten cache positions hold NaN: reading one would poison the output.
  VecF kc(static_cast<size_t>(s.B) * maxT * KV, test::kNaN), vc = kc;
  VecF got(out_size(s), test::kNaN);
  for (int pos0 = 0; pos0 < s.T;) {
    const int Tq = std::min(pos0 == 0 ? prefill : step, s.T - pos0);
    AttentionShape q = s;
    q.T = Tq;
    VecF in(static_cast<size_t>(s.B) * Tq * R), out(static_cast<size_t>(s.B) * Tq * O, test::kNaN);
    for (int b = 0; b < s.B; ++b)
      std::copy_n(&qkv[(static_cast<size_t>(b) * s.T + pos0) * R], Tq * R,
                  &in[static_cast<size_t>(b) * Tq * R]);
    attention_kv_cache(out.data(), in.data(), kc.data(), vc.data(), pos0, maxT, q);
    for (int b = 0; b < s.B; ++b)
      std::copy_n(&out[static_cast<size_t>(b) * Tq * O], Tq * O,
                  &got[(static_cast<size_t>(b) * s.T + pos0) * O]);
    pos0 += Tq;
  }
  EXPECT_LT(test::rel_err(got, test::to_double(want)), 1e-6);
  // The caches hold exactly the k and v heads of every position, and nothing beyond.
  for (int b = 0; b < s.B; ++b)
    for (int t = 0; t < maxT; ++t)
      for (int64_t c = 0; c < KV; ++c) {
        const size_t at = (static_cast<size_t>(b) * maxT + t) * KV + c;
        if (t < s.T) {
          const size_t row = (static_cast<size_t>(b) * s.T + t) * R;
          ASSERT_EQ(kc[at], qkv[row + int64_t{s.NH} * s.HS + c]);
          ASSERT_EQ(vc[at], qkv[row + int64_t{s.NH} * s.HS + KV + c]);
        } else {
          ASSERT_TRUE(std::isnan(kc[at]) && std::isnan(vc[at]));
        }
      }
}

TEST(Attention, KvCacheDecodingEqualsTheFullForward) {
  check_kv_cache({2, 37, 4, 2, 16, 0}, /*prefill=*/20, /*step=*/1, /*maxT=*/40, 600);
  check_kv_cache({2, 37, 4, 1, 32, 8}, /*prefill=*/20, /*step=*/1, /*maxT=*/37, 610);
  check_kv_cache({2, 37, 4, 4, 64, 0}, /*prefill=*/1, /*step=*/3, /*maxT=*/50, 620);
  // Prefill longer than a query block, windows reaching back into it, chunked decode.
  check_kv_cache({1, 150, 4, 2, 16, 70}, /*prefill=*/100, /*step=*/7, /*maxT=*/160, 630);
  check_kv_cache({2, 90, 6, 3, 5, 0}, /*prefill=*/kAttentionBlockQ + 3, /*step=*/1, /*maxT=*/90,
                 640);
}

TEST(Attention, KvCacheRejectsPositionsOutsideTheCache) {
  const AttentionShape s{1, 4, 2, 1, 8, 0};
  VecF qkv(qkv_size(s)), out(out_size(s)), kc(10 * 8), vc(10 * 8);
  EXPECT_ANY_THROW(attention_kv_cache(out.data(), qkv.data(), kc.data(), vc.data(), 7, 10, s));
  EXPECT_ANY_THROW(attention_kv_cache(out.data(), qkv.data(), kc.data(), vc.data(), -1, 10, s));
  EXPECT_NO_THROW(attention_kv_cache(out.data(), qkv.data(), kc.data(), vc.data(), 6, 10, s));
}

TEST(Attention, RejectsBadShapes) {
  VecF qkv(1000), out(1000), lse(100);
  auto fwd = [&](AttentionShape s) { attention_forward(out.data(), lse.data(), qkv.data(), s); };
  EXPECT_ANY_THROW(fwd({1, 1, 3, 2, 4, 0}));   // NH not a multiple of KVH
  EXPECT_ANY_THROW(fwd({1, 1, 2, 0, 4, 0}));   // no kv heads
  EXPECT_ANY_THROW(fwd({1, 1, 2, 2, 0, 0}));   // empty heads
  EXPECT_ANY_THROW(fwd({1, 1, 2, 2, 4, -1}));  // negative window
  EXPECT_NO_THROW(fwd({1, 1, 2, 1, 4, 0}));
}

}  // namespace
}  // namespace zerod::cpu
