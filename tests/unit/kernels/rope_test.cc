#include "kernels/cpu/rope.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.h"

namespace zerod::cpu {
namespace {

using test::VecD;
using test::VecF;

struct Tables {
  VecF cos, sin;
};

// Hugging Face's tables: angle[t,i] = (pos0 + t) * theta^(-2i/HS), i < HS/2.
Tables rope_tables(int T, int HS, int pos0, double theta = 10000.0) {
  const int half = HS / 2;
  Tables tb{VecF(static_cast<size_t>(T) * half), VecF(static_cast<size_t>(T) * half)};
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < half; ++i) {
      const double inv_freq = std::pow(theta, -2.0 * i / HS);
      const double a = (pos0 + t) * inv_freq;
      tb.cos[static_cast<size_t>(t) * half + i] = static_cast<float>(std::cos(a));
      tb.sin[static_cast<size_t>(t) * half + i] = static_cast<float>(std::sin(a));
    }
  return tb;
}

// HF's q * cos + rotate_half(q) * sin on the q and k heads, in double (cos and sin repeated
// over both halves, rotate_half(x) = (-x2, x1)).
VecD rope_ref(const VecD& qkv, const Tables& tb, const AttentionShape& s) {
  VecD out = qkv;
  const int half = s.HS / 2;
  for (int b = 0; b < s.B; ++b)
    for (int t = 0; t < s.T; ++t)
      for (int h = 0; h < s.NH + s.KVH; ++h) {
        const size_t at =
            (static_cast<size_t>(b) * s.T + t) * s.qkv_row() + static_cast<size_t>(h) * s.HS;
        for (int c = 0; c < s.HS; ++c) {
          const double cs = tb.cos[static_cast<size_t>(t) * half + c % half];
          const double sn = tb.sin[static_cast<size_t>(t) * half + c % half];
          const double rot = c < half ? -qkv[at + c + half] : qkv[at + c - half];
          out[at + c] = qkv[at + c] * cs + rot * sn;
        }
      }
  return out;
}

void check_rope(const AttentionShape& s, int pos0, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "B=" << s.B << " T=" << s.T << " NH=" << s.NH
                                  << " KVH=" << s.KVH << " HS=" << s.HS << " pos0=" << pos0);
  const Tables tb = rope_tables(s.T, s.HS, pos0);
  const int64_t n = int64_t{s.B} * s.T * s.qkv_row();
  const VecF x = test::randn(n, seed);
  VecF y = x;
  rope_forward(y.data(), tb.cos.data(), tb.sin.data(), s);
  const VecD xd = test::to_double(x);
  EXPECT_LT(test::rel_err(y, rope_ref(xd, tb, s)), 1e-6);

  // v untouched (bit for bit); every rotated pair keeps its length; q and k did change.
  const int half = s.HS / 2;
  double moved = 0.0;
  for (int64_t r = 0; r < int64_t{s.B} * s.T; ++r) {
    const size_t row = static_cast<size_t>(r * s.qkv_row());
    for (int64_t c = int64_t{s.NH + s.KVH} * s.HS; c < s.qkv_row(); ++c)
      ASSERT_EQ(y[row + c], x[row + c]);
    for (int h = 0; h < s.NH + s.KVH; ++h)
      for (int i = 0; i < half; ++i) {
        const size_t a = row + static_cast<size_t>(h) * s.HS + i, b = a + half;
        const double before = xd[a] * xd[a] + xd[b] * xd[b];
        const double after = double{y[a]} * y[a] + double{y[b]} * y[b];
        ASSERT_NEAR(after, before, 1e-6 * std::max(1.0, before));
        moved = std::max(moved, std::fabs(double{y[a]} - xd[a]));
      }
  }
  if (pos0 + s.T > 1) {
    EXPECT_GT(moved, 0.1);
  }

  // backward(forward(x)) == x: the inverse rotation.
  VecF back = y;
  rope_backward(back.data(), tb.cos.data(), tb.sin.data(), s);
  EXPECT_LT(test::rel_err(back, xd), 1e-6);

  // The backward is the gradient: of sum(w * rope(x)) with respect to x (exact for a linear
  // map, so central differences are exact up to rounding).
  const VecF w = test::randn(n, seed + 1);
  VecF dx = w;
  rope_backward(dx.data(), tb.cos.data(), tb.sin.data(), s);
  const VecD wd = test::to_double(w);
  auto f = [&](const VecD& v) { return test::dot(wd, rope_ref(v, tb, s)); };
  const auto idx = test::sample_indices(static_cast<size_t>(n), 300, seed);
  EXPECT_LT(test::rel_err(dx, test::fd_gradient(f, xd, idx, 1e-3), idx), 1e-6);
}

TEST(Rope, MatchesHuggingFaceRotateHalf) {
  // {B, T, NH, KVH, HS, window}
  check_rope({2, 7, 4, 2, 16, 0}, /*pos0=*/0, 10);
  check_rope({1, 5, 3, 1, 6, 0}, /*pos0=*/11, 20);  // odd head counts, positions offset
  check_rope({3, 4, 2, 2, 2, 0}, /*pos0=*/1, 30);   // the smallest head
  check_rope({1, 1, 1, 1, 128, 0}, /*pos0=*/4095, 40);
}

TEST(Rope, PositionZeroIsTheIdentity) {
  const AttentionShape s{1, 1, 2, 1, 8, 0};
  const Tables tb = rope_tables(1, 8, 0);
  const VecF x = test::randn(s.qkv_row(), 50);
  VecF y = x;
  rope_forward(y.data(), tb.cos.data(), tb.sin.data(), s);
  EXPECT_TRUE(test::bitwise_equal(x, y));
}

TEST(Rope, DocumentMaskingRotatesEachDocumentFromPositionZero) {
  // Row 0: documents [0,3), [3,4), [4,9); row 1: [0,6), [6,9). Each document's rows, rotated
  // with s.doc_start, equal the document rotated alone as a sequence of its own.
  const AttentionShape plain{2, 9, 3, 1, 8, 0};
  const std::vector<int32_t> ds = {0, 0, 0, 3, 4, 4, 4, 4, 4, 0, 0, 0, 0, 0, 0, 6, 6, 6};
  AttentionShape s = plain;
  s.doc_start = ds.data();
  const Tables tb = rope_tables(s.T, s.HS, 0);
  const int64_t R = s.qkv_row(), n = int64_t{s.B} * s.T * R;
  const VecF x = test::randn(n, 60);
  VecF fwd = x, bwd = x;
  rope_forward(fwd.data(), tb.cos.data(), tb.sin.data(), s);
  rope_backward(bwd.data(), tb.cos.data(), tb.sin.data(), s);
  for (int b = 0; b < s.B; ++b) {
    for (int t0 = 0; t0 < s.T;) {
      int t1 = t0 + 1;
      while (t1 < s.T && ds[static_cast<size_t>(b * s.T + t1)] == t0) ++t1;
      AttentionShape one = plain;
      one.B = 1;
      one.T = t1 - t0;
      const auto begin = x.begin() + (int64_t{b} * s.T + t0) * R;
      VecF f(begin, begin + one.T * R), g = f;
      rope_forward(f.data(), tb.cos.data(), tb.sin.data(), one);
      rope_backward(g.data(), tb.cos.data(), tb.sin.data(), one);
      for (int64_t i = 0; i < one.T * R; ++i) {
        const size_t at = static_cast<size_t>((int64_t{b} * s.T + t0) * R + i);
        ASSERT_EQ(fwd[at], f[static_cast<size_t>(i)]) << "b=" << b << " t0=" << t0 << " i=" << i;
        ASSERT_EQ(bwd[at], g[static_cast<size_t>(i)]) << "b=" << b << " t0=" << t0 << " i=" << i;
      }
      t0 = t1;
    }
  }
}

TEST(Rope, RejectsOddHeadSize) {
  const AttentionShape s{1, 1, 1, 1, 5, 0};
  VecF qkv(15), cs(2), sn(2);
  EXPECT_ANY_THROW(rope_forward(qkv.data(), cs.data(), sn.data(), s));
  EXPECT_ANY_THROW(rope_backward(qkv.data(), cs.data(), sn.data(), s));
}

}  // namespace
}  // namespace zerod::cpu
