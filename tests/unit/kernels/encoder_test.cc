#include "kernels/cpu/encoder.h"

#include <gtest/gtest.h>

#include <string>

#include "kernel_test_util.h"

namespace zerod::cpu {
namespace {

using test::VecD;
using test::VecF;

// Reference: out[b,t,c] = wte[tok[b,t], c] + wpe[t, c], in double.
VecD encoder_ref(const std::vector<int32_t>& tok, const VecD& wte, const VecD& wpe, int B, int T,
                 int C) {
  VecD out(static_cast<size_t>(B) * T * C);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c)
        out[(static_cast<size_t>(b) * T + t) * C + c] =
            wte[static_cast<size_t>(tok[b * T + t]) * C + c] + wpe[static_cast<size_t>(t) * C + c];
  return out;
}

TEST(Encoder, ForwardAndBackwardMatchFiniteDifferences) {
  const int B = 3, T = 5, C = 7, Vp = 11, maxT = 9;
  // Repeated tokens (3 appears four times, across batches) exercise the accumulation order;
  // rows 0, 2, 10 of wte are never used and must stay untouched.
  const std::vector<int32_t> tok = {3, 1, 4, 1, 5, 9, 3, 6, 5, 3, 5, 8, 9, 7, 3};
  const VecF wte = test::randn(Vp * C, 1);
  const VecF wpe = test::randn(maxT * C, 2);
  VecF out(B * T * C);
  encoder_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
  const VecD ref = encoder_ref(tok, test::to_double(wte), test::to_double(wpe), B, T, C);
  EXPECT_LT(test::rel_err(out, ref), 1e-7);

  const VecF w = test::randn(B * T * C, 3);
  const VecD wd = test::to_double(w);
  const VecF dwte0 = test::randn(Vp * C, 4);  // += outputs start from random values
  const VecF dwpe0 = test::randn(maxT * C, 5);
  VecF dwte = dwte0, dwpe = dwpe0;
  encoder_backward(dwte.data(), dwpe.data(), w.data(), tok.data(), B, T, C);

  const VecD wpe_d = test::to_double(wpe), wte_d = test::to_double(wte);
  auto f_wte = [&](const VecD& x) { return test::dot(wd, encoder_ref(tok, x, wpe_d, B, T, C)); };
  auto f_wpe = [&](const VecD& x) { return test::dot(wd, encoder_ref(tok, wte_d, x, B, T, C)); };
  const auto all_wte = test::sample_indices(wte.size(), wte.size(), 0);
  const auto all_wpe = test::sample_indices(wpe.size(), wpe.size(), 0);
  const VecD g_wte = test::fd_gradient(f_wte, wte_d, all_wte);
  const VecD g_wpe = test::fd_gradient(f_wpe, wpe_d, all_wpe);
  EXPECT_LT(test::rel_err(test::minus(dwte, dwte0), g_wte), 1e-5);
  EXPECT_LT(test::rel_err(test::minus(dwpe, dwpe0), g_wpe), 1e-5);
  // Unused vocabulary rows and positions >= T are left exactly as they were.
  for (int v : {0, 2, 10})
    for (int c = 0; c < C; ++c) EXPECT_EQ(dwte[v * C + c], dwte0[v * C + c]);
  for (int t = T; t < maxT; ++t)
    for (int c = 0; c < C; ++c) EXPECT_EQ(dwpe[t * C + c], dwpe0[t * C + c]);
}

TEST(Encoder, WithoutPositionEmbedding) {
  const int B = 2, T = 4, C = 5, Vp = 6;
  const std::vector<int32_t> tok = {3, 1, 3, 0, 5, 3, 2, 1};
  const VecF wte = test::randn(Vp * C, 11), wpe = test::randn(T * C, 12);
  VecF out(B * T * C, test::kNaN);
  encoder_forward(out.data(), tok.data(), wte.data(), nullptr, B, T, C);
  for (int r = 0; r < B * T; ++r)
    for (int c = 0; c < C; ++c) ASSERT_EQ(out[r * C + c], wte[tok[r] * C + c]);

  // dwte as with a position embedding (bit for bit); a null dwpe is simply skipped.
  const VecF g = test::randn(B * T * C, 13), dwte0 = test::randn(Vp * C, 14);
  VecF dwte = dwte0, dwte_ref = dwte0, dwpe(T * C, 0.0f);
  encoder_backward(dwte.data(), nullptr, g.data(), tok.data(), B, T, C);
  encoder_backward(dwte_ref.data(), dwpe.data(), g.data(), tok.data(), B, T, C);
  EXPECT_TRUE(test::bitwise_equal(dwte, dwte_ref));
  EXPECT_FALSE(test::bitwise_equal(dwte, dwte0));
}

// ---- tokens < 0: no row in this vocabulary shard ----------------------------------------------

TEST(Encoder, NegativeTokensGetThePositionOnlyAndNoWteGradient) {
  const int B = 2, T = 5, C = 6, Vp = 7;
  const std::vector<int32_t> tok = {-1, 3, 0, -7, 3, 6, -1, 3, -2, 0};
  const VecF wte = test::randn(Vp * C, 21), wpe = test::randn(T * C, 22);
  VecF out(B * T * C, test::kNaN), out_nopos(B * T * C, test::kNaN);
  encoder_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
  encoder_forward(out_nopos.data(), tok.data(), wte.data(), nullptr, B, T, C);
  for (int r = 0; r < B * T; ++r) {
    const int t = r % T;
    for (int c = 0; c < C; ++c) {
      const float e = tok[r] >= 0 ? wte[tok[r] * C + c] : 0.0f;
      const float want = tok[r] >= 0 ? e + wpe[t * C + c] : wpe[t * C + c];
      ASSERT_EQ(out[r * C + c], want) << "row " << r;
      ASSERT_EQ(out_nopos[r * C + c], e) << "row " << r;  // 0 for a token < 0
    }
  }

  // dwte gets the rows of tokens >= 0 only (in position order); dwpe gets every row.
  const VecF g = test::randn(B * T * C, 23);
  const VecF dwte0 = test::randn(Vp * C, 24), dwpe0 = test::randn(T * C, 25);
  VecF dwte = dwte0, dwpe = dwpe0;
  encoder_backward(dwte.data(), dwpe.data(), g.data(), tok.data(), B, T, C);
  VecF want_dwte = dwte0, want_dwpe = dwpe0;
  for (int r = 0; r < B * T; ++r) {
    for (int c = 0; c < C; ++c) {
      if (tok[r] >= 0) want_dwte[tok[r] * C + c] += g[r * C + c];
    }
  }
  for (int t = 0; t < T; ++t)
    for (int b = 0; b < B; ++b)
      for (int c = 0; c < C; ++c) want_dwpe[t * C + c] += g[(b * T + t) * C + c];
  EXPECT_TRUE(test::bitwise_equal(dwte, want_dwte));
  EXPECT_TRUE(test::bitwise_equal(dwpe, want_dwpe));

  // Without a position embedding only dwte changes, the same way.
  VecF dwte2 = dwte0;
  encoder_backward(dwte2.data(), nullptr, g.data(), tok.data(), B, T, C);
  EXPECT_TRUE(test::bitwise_equal(dwte2, want_dwte));

  // Every token negative: out = wpe, dwte untouched.
  const std::vector<int32_t> none(B * T, -1);
  encoder_forward(out.data(), none.data(), wte.data(), wpe.data(), B, T, C);
  for (int r = 0; r < B * T; ++r)
    for (int c = 0; c < C; ++c) ASSERT_EQ(out[r * C + c], wpe[(r % T) * C + c]);
  VecF dwte3 = dwte0;
  encoder_backward(dwte3.data(), nullptr, g.data(), none.data(), B, T, C);
  EXPECT_TRUE(test::bitwise_equal(dwte3, dwte0));
}

TEST(Encoder, VocabularyShardsMatchTheReferenceOnTheirSubVocabulary) {
  // A 12-row table split into S = 1..4 shards of 12/S rows; shard s sees token v as v - v0 when
  // it holds it, else as -1.
  const int B = 3, T = 4, C = 5, Vp = 12;
  const std::vector<int32_t> tok = {0, 11, 5, 5, 3, 6, 2, 11, 9, 8, 0, 4};
  const VecF wte = test::randn(Vp * C, 31), wpe = test::randn(T * C, 32);
  const VecF g = test::randn(B * T * C, 33), dwte0 = test::randn(Vp * C, 34);
  VecF out_full(B * T * C), dwte_full = dwte0, dwpe_full(T * C, 0.0f);
  encoder_forward(out_full.data(), tok.data(), wte.data(), nullptr, B, T, C);
  encoder_backward(dwte_full.data(), dwpe_full.data(), g.data(), tok.data(), B, T, C);
  const VecD wpe_d = test::to_double(wpe);
  for (int S = 1; S <= 4; ++S) {
    SCOPED_TRACE("S=" + std::to_string(S));
    const int Vl = Vp / S;
    VecF out_sum(B * T * C, 0.0f), dwte_cat(Vp * C, test::kNaN);
    for (int s = 0; s < S; ++s) {
      const int v0 = s * Vl;
      std::vector<int32_t> local(tok.size());
      for (size_t i = 0; i < tok.size(); ++i)
        local[i] = tok[i] >= v0 && tok[i] < v0 + Vl ? tok[i] - v0 : -1;
      const VecF wte_s(wte.begin() + v0 * C, wte.begin() + (v0 + Vl) * C);

      // Forward with wpe against the reference on the sub-vocabulary (a row of zeros stands
      // for the tokens this shard lacks).
      VecF out(B * T * C, test::kNaN);
      encoder_forward(out.data(), local.data(), wte_s.data(), wpe.data(), B, T, C);
      VecD wte_ext(static_cast<size_t>(Vl + 1) * C, 0.0);
      for (int i = 0; i < Vl * C; ++i) wte_ext[i] = wte_s[i];
      std::vector<int32_t> ext = local;
      for (auto& v : ext) v = v < 0 ? Vl : v;
      EXPECT_LT(test::rel_err(out, encoder_ref(ext, wte_ext, wpe_d, B, T, C)), 1e-7);

      // Without wpe the shards' outputs add up to the full table's, exactly.
      encoder_forward(out.data(), local.data(), wte_s.data(), nullptr, B, T, C);
      for (size_t i = 0; i < out.size(); ++i) out_sum[i] += out[i];

      // Backward: the shards' dwte side by side equal the full dwte bit for bit, and each
      // shard's dwpe equals the full dwpe (every position contributes to it).
      VecF dwte_s(dwte0.begin() + v0 * C, dwte0.begin() + (v0 + Vl) * C), dwpe(T * C, 0.0f);
      encoder_backward(dwte_s.data(), dwpe.data(), g.data(), local.data(), B, T, C);
      std::copy(dwte_s.begin(), dwte_s.end(), dwte_cat.begin() + v0 * C);
      EXPECT_TRUE(test::bitwise_equal(dwpe, dwpe_full)) << "shard " << s;
    }
    EXPECT_TRUE(test::bitwise_equal(out_sum, out_full));
    EXPECT_TRUE(test::bitwise_equal(dwte_cat, dwte_full));
  }
}

TEST(Encoder, DocumentMaskingUsesPositionsWithinEachDocument) {
  const int B = 2, T = 7, C = 70, Vp = 5;  // C > 64: more than one channel chunk in backward
  const std::vector<int32_t> tok = {1, 2, 0, 3, 4, 1, 1, 2, 2, 0, 3, 3, 4, 0};
  // Row 0: documents [0,3), [3,4), [4,7); row 1: [0,5), [5,7).
  const std::vector<int32_t> ds = {0, 0, 0, 3, 4, 4, 4, 0, 0, 0, 0, 0, 5, 5};
  const VecF wte = test::randn(Vp * C, 11), wpe = test::randn(T * C, 12);
  VecF out(static_cast<size_t>(B) * T * C);
  encoder_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C, ds.data());
  const VecF g = test::randn(B * T * C, 13);
  const VecF dwpe0 = test::randn(T * C, 14);
  VecF dwte(static_cast<size_t>(Vp) * C, 0.0f), dwpe = dwpe0;
  encoder_backward(dwte.data(), dwpe.data(), g.data(), tok.data(), B, T, C, ds.data());
  VecD want_dwpe = test::to_double(dwpe0);
  for (int r = 0; r < B * T; ++r) {
    const int p = r % T - ds[static_cast<size_t>(r)];
    for (int c = 0; c < C; ++c) {
      const size_t i = static_cast<size_t>(r) * C + c;
      ASSERT_EQ(out[i], wte[static_cast<size_t>(tok[static_cast<size_t>(r)]) * C + c] +
                            wpe[static_cast<size_t>(p) * C + c])
          << r << " " << c;
      want_dwpe[static_cast<size_t>(p) * C + c] += g[i];
    }
  }
  EXPECT_LT(test::rel_err(dwpe, want_dwpe), 1e-6);
  // The wte gradient does not depend on positions.
  VecF dwte_plain(dwte.size(), 0.0f), dwpe_plain = dwpe0;
  encoder_backward(dwte_plain.data(), dwpe_plain.data(), g.data(), tok.data(), B, T, C);
  EXPECT_TRUE(test::bitwise_equal(dwte, dwte_plain));
  // One document per row (doc_start 0) is the unmasked encoder bit for bit.
  const std::vector<int32_t> zeros(static_cast<size_t>(B) * T, 0);
  VecF out0(out.size()), out1(out.size()), dwpe_zero = dwpe0, dwte_zero(dwte.size(), 0.0f);
  encoder_forward(out0.data(), tok.data(), wte.data(), wpe.data(), B, T, C, zeros.data());
  encoder_forward(out1.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
  EXPECT_TRUE(test::bitwise_equal(out0, out1));
  encoder_backward(dwte_zero.data(), dwpe_zero.data(), g.data(), tok.data(), B, T, C, zeros.data());
  EXPECT_TRUE(test::bitwise_equal(dwpe_zero, dwpe_plain));
}

}  // namespace
}  // namespace zerod::cpu
