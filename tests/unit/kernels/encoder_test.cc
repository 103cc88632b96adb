#include "kernels/cpu/encoder.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace zerod::cpu
