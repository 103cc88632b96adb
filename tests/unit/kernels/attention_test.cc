#include "kernels/cpu/attention.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.h"

namespace zerod::cpu {
namespace {

using test::VecD;
using test::VecF;

struct AttnRef {
  VecD out, lse;
};

// Causal multi-head attention in double, straight from the definition.
AttnRef attention_ref(const VecD& qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  AttnRef r{VecD(static_cast<size_t>(B) * T * C, 0.0), VecD(static_cast<size_t>(B) * NH * T)};
  VecD s(T);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int i = 0; i < T; ++i) {
        const double* q = &qkv[(static_cast<size_t>(b) * T + i) * 3 * C + h * hs];
        double m = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          const double* k = &qkv[(static_cast<size_t>(b) * T + j) * 3 * C + C + h * hs];
          double d = 0.0;
          for (int c = 0; c < hs; ++c) d += q[c] * k[c];
          s[j] = d * scale;
          m = std::max(m, s[j]);
        }
        double sum = 0.0;
        for (int j = 0; j <= i; ++j) sum += std::exp(s[j] - m);
        r.lse[(static_cast<size_t>(b) * NH + h) * T + i] = m + std::log(sum);
        double* o = &r.out[(static_cast<size_t>(b) * T + i) * C + h * hs];
        for (int j = 0; j <= i; ++j) {
          const double p = std::exp(s[j] - m) / sum;
          const double* v = &qkv[(static_cast<size_t>(b) * T + j) * 3 * C + 2 * C + h * hs];
          for (int c = 0; c < hs; ++c) o[c] += p * v[c];
        }
      }
  return r;
}

void check_attention(int B, int T, int C, int NH, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "B=" << B << " T=" << T << " C=" << C << " NH=" << NH);
  const VecF qkv = test::randn(static_cast<int64_t>(B) * T * 3 * C, seed, 1.5f);
  VecF out(static_cast<size_t>(B) * T * C, test::kNaN), lse(static_cast<size_t>(B) * NH * T);
  attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
  const VecD qd = test::to_double(qkv);
  const AttnRef ref = attention_ref(qd, B, T, C, NH);
  EXPECT_LT(test::rel_err(out, ref.out), 1e-5);
  EXPECT_LT(test::rel_err(lse, ref.lse), 1e-6);

  const VecF g = test::randn(static_cast<int64_t>(B) * T * C, seed + 1);
  const VecD gd = test::to_double(g);
  VecF dqkv(qkv.size(), test::kNaN);  // = output
  attention_backward(dqkv.data(), g.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH);
  auto f = [&](const VecD& x) { return test::dot(gd, attention_ref(x, B, T, C, NH).out); };
  const auto idx = test::sample_indices(qkv.size(), 300, seed);
  const VecD want = test::fd_gradient(f, qd, idx);
  EXPECT_LT(test::rel_err(dqkv, want, idx), 2e-5);     // observed <= 4e-7
  for (float x : dqkv) ASSERT_TRUE(std::isfinite(x));  // every element written
}

TEST(Attention, SingleTokenAndSmallShapes) {
  check_attention(/*B=*/1, /*T=*/1, /*C=*/6, /*NH=*/2, 200);
  check_attention(/*B=*/2, /*T=*/5, /*C=*/12, /*NH=*/3, 210);
  check_attention(/*B=*/3, /*T=*/7, /*C=*/5, /*NH=*/1, 220);
}

TEST(Attention, SequencesLongerThanTheQueryBlock) {
  static_assert(kAttentionBlockQ < 67);
  check_attention(/*B=*/1, /*T=*/67, /*C=*/8, /*NH=*/2, 230);
  check_attention(/*B=*/2, /*T=*/2 * kAttentionBlockQ + 3, /*C=*/12, /*NH=*/4, 240);
}

TEST(Attention, RejectsChannelsNotDivisibleByHeads) {
  VecF qkv(3 * 10), out(10), lse(3);
  EXPECT_ANY_THROW(attention_forward(out.data(), lse.data(), qkv.data(), 1, 1, 10, 3));
}

}  // namespace
}  // namespace zerod::cpu
