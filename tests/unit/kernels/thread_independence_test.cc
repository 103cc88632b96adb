// Every op's results are bit-identical with 1 and 2 OpenMP threads (later multi-rank tests
// compare runs with different thread counts). Shapes are large enough that every kernel takes
// its parallel path (kParallelMinElems elements and more than one reduction chunk).
#include <gtest/gtest.h>

#include "kernel_test_util.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/crossentropy.h"
#include "kernels/cpu/encoder.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/parallel.h"

namespace zerod::cpu {
namespace {

using test::VecF;

using Outputs = std::vector<VecF>;

void expect_same(const std::pair<Outputs, Outputs>& r) {
  ASSERT_EQ(r.first.size(), r.second.size());
  for (size_t i = 0; i < r.first.size(); ++i)
    EXPECT_TRUE(test::bitwise_equal(r.first[i], r.second[i])) << "output " << i;
}

TEST(ThreadIndependence, Encoder) {
  const int B = 4, T = 65, C = 129, Vp = 50;
  static_assert(int64_t{B} * T * C >= kParallelMinElems);
  std::vector<int32_t> tok(B * T);
  for (int i = 0; i < B * T; ++i) tok[i] = (i * 7) % 23;  // many repeats
  const VecF wte = test::randn(Vp * C, 1), wpe = test::randn(T * C, 2),
             g = test::randn(B * T * C, 3);
  expect_same(test::with_1_and_2_threads([&] {
    VecF out(B * T * C), dwte = test::randn(Vp * C, 4), dwpe = test::randn(T * C, 5);
    encoder_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
    encoder_backward(dwte.data(), dwpe.data(), g.data(), tok.data(), B, T, C);
    return Outputs{out, dwte, dwpe};
  }));
}

TEST(ThreadIndependence, LayerNorm) {
  const int64_t N = 301;  // 19 chunks of 16 rows
  const int C = 129;
  const VecF x = test::randn(N * C, 10), w = test::randn(C, 11), b = test::randn(C, 12),
             g = test::randn(N * C, 13);
  expect_same(test::with_1_and_2_threads([&] {
    VecF out(N * C), mean(N), rstd(N), dx = test::randn(N * C, 14), dw = test::randn(C, 15),
                                       db = test::randn(C, 16);
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    layernorm_backward(dx.data(), dw.data(), db.data(), g.data(), x.data(), w.data(), mean.data(),
                       rstd.data(), N, C);
    return Outputs{out, mean, rstd, dx, dw, db};
  }));
}

TEST(ThreadIndependence, Matmul) {
  const int64_t N = 257;
  const int C = 130, OC = 131;
  const VecF x = test::randn(N * C, 20), w = test::randn(OC * C, 21), b = test::randn(OC, 22),
             g = test::randn(N * OC, 23);
  expect_same(test::with_1_and_2_threads([&] {
    VecF out(N * OC), dx = test::randn(N * C, 24), dw = test::randn(OC * C, 25),
                      db = test::randn(OC, 26);
    matmul_forward(out.data(), x.data(), w.data(), b.data(), N, C, OC);
    matmul_backward(dx.data(), dw.data(), db.data(), g.data(), x.data(), w.data(), N, C, OC, true);
    return Outputs{out, dx, dw, db};
  }));
}

TEST(ThreadIndependence, Attention) {
  const int B = 2, T = 100, C = 48, NH = 3;
  const VecF qkv = test::randn(B * T * 3 * C, 30), g = test::randn(B * T * C, 31);
  expect_same(test::with_1_and_2_threads([&] {
    VecF out(B * T * C), lse(B * NH * T), dqkv(B * T * 3 * C);
    attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
    attention_backward(dqkv.data(), g.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH);
    return Outputs{out, lse, dqkv};
  }));
}

TEST(ThreadIndependence, GeluAndCrossEntropyAndAdamW) {
  const int64_t n = 100003;
  const VecF x = test::randn(n, 40), g = test::randn(n, 41);
  const int64_t N = 37;
  const int V = 1000, Vp = 1024;
  const VecF logits = test::randn(N * Vp, 42, 2.0f);
  std::vector<int32_t> t(N);
  for (int64_t i = 0; i < N; ++i) t[i] = i % 5 == 0 ? -1 : static_cast<int32_t>(i * 31 % V);
  expect_same(test::with_1_and_2_threads([&] {
    VecF y(n), dx(n), loss(N), loss2(N), d = logits;
    gelu_forward(y.data(), x.data(), n);
    gelu_backward(dx.data(), x.data(), g.data(), n);
    crossentropy_forward(loss.data(), logits.data(), t.data(), N, V, Vp);
    crossentropy_fused(loss2.data(), d.data(), t.data(), N, V, Vp, 0.5f);
    VecF p = x, m = g, v(n, 0.01f), out(n);
    AdamWParams P;
    P.weight_decay = 0.1f;
    adamw_update(p.data(), m.data(), v.data(), g.data(), out.data(), n, P, DType::kBF16);
    return Outputs{y, dx, loss, loss2, d, p, m, v, out};
  }));
}

}  // namespace
}  // namespace zerod::cpu
