// Every op's results are bit-identical with 1 and 2 OpenMP threads (later multi-rank tests
// compare runs with different thread counts). Shapes are large enough that every kernel takes
// its parallel path (kParallelMinElems elements and more than one reduction chunk).
#include <gtest/gtest.h>

#include "kernel_test_util.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_block.h"
#include "kernels/cpu/crossentropy.h"
#include "kernels/cpu/encoder.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"

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
    VecF out2(B * T * C), dwte2 = test::randn(Vp * C, 4);  // without position embedding
    encoder_forward(out2.data(), tok.data(), wte.data(), nullptr, B, T, C);
    encoder_backward(dwte2.data(), nullptr, g.data(), tok.data(), B, T, C);
    return Outputs{out, dwte, dwpe, out2, dwte2};
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

void expect_attention_thread_independent(const AttentionShape& s, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "NH=" << s.NH << " KVH=" << s.KVH << " window=" << s.window);
  const int64_t rows = int64_t{s.B} * s.T;
  const VecF qkv = test::randn(rows * s.qkv_row(), seed), g = test::randn(rows * s.out_row(), seed);
  const int maxT = s.T + 3, prefill = s.T - 5;
  expect_same(test::with_1_and_2_threads([&] {
    VecF out(rows * s.out_row()), lse(rows * s.NH), dqkv(rows * s.qkv_row());
    attention_forward(out.data(), lse.data(), qkv.data(), s);
    attention_backward(dqkv.data(), g.data(), qkv.data(), out.data(), lse.data(), s);
    // The KV cache: a prefill of all but 5 positions (batch 0 only: B = 1).
    AttentionShape p = s;
    p.B = 1;
    p.T = prefill;
    VecF kc(static_cast<size_t>(maxT) * s.KVH * s.HS),
        vc = kc, cached(static_cast<size_t>(prefill) * s.out_row());
    attention_kv_cache(cached.data(), qkv.data(), kc.data(), vc.data(), 0, maxT, p);
    return Outputs{out, lse, dqkv, cached, kc, vc};
  }));
}

TEST(ThreadIndependence, Attention) {
  expect_attention_thread_independent({2, 100, 3, 3, 16, 0}, 30);   // GPT-2's MHA
  expect_attention_thread_independent({2, 100, 4, 2, 16, 24}, 32);  // GQA + sliding window
  expect_attention_thread_independent({3, 70, 4, 1, 8, 0}, 34);     // multi-query, odd B
}

// Ring attention's block ops: rank 0 of the load-balanced split of 140 positions over 2 ranks
// (70 query rows: more than one query block) meets its own block and rank 1's.
TEST(ThreadIndependence, AttentionBlock) {
  for (const AttentionShape whole :
       {AttentionShape{2, 140, 3, 3, 16, 0}, AttentionShape{2, 140, 4, 2, 16, 24}}) {
    std::vector<int32_t> mine, theirs;
    for (int t = 0; t < 140; ++t) ((t < 35 || t >= 105) ? mine : theirs).push_back(t);
    AttentionShape s = whole;
    s.T = 70;
    const int64_t kvw = int64_t{2} * s.KVH * s.HS;
    const VecF qkv = test::randn(int64_t{s.B} * 70 * s.qkv_row(), 36),
               kv0 = test::randn(int64_t{s.B} * 70 * kvw, 37),
               kv1 = test::randn(int64_t{s.B} * 70 * kvw, 38),
               dout = test::randn(int64_t{s.B} * 70 * s.out_row(), 39);
    expect_same(test::with_1_and_2_threads([&] {
      VecF out(int64_t{s.B} * 70 * s.out_row()), lse(int64_t{s.B} * s.NH * 70);
      attention_block_forward(out.data(), lse.data(), qkv.data(), mine.data(), kv0.data(),
                              mine.data(), 70, s, true);
      attention_block_forward(out.data(), lse.data(), qkv.data(), mine.data(), kv1.data(),
                              theirs.data(), 70, s, false);
      VecF dqkv(qkv.size(), 0.0f), dkv0(kv0.size()), dkv1 = test::randn(kv1.size(), 40);
      attention_block_backward(dqkv.data(), dkv0.data(), dout.data(), qkv.data(), mine.data(),
                               kv0.data(), mine.data(), 70, out.data(), lse.data(), s, false);
      attention_block_backward(dqkv.data(), dkv1.data(), dout.data(), qkv.data(), mine.data(),
                               kv1.data(), theirs.data(), 70, out.data(), lse.data(), s, true);
      return Outputs{out, lse, dqkv, dkv0, dkv1};
    }));
  }
}

TEST(ThreadIndependence, RmsNormRopeSwiGlu) {
  const int64_t N = 301;  // 19 chunks of 16 rows
  const int C = 129;
  const VecF x = test::randn(N * C, 50), w = test::randn(C, 51), g = test::randn(N * C, 52);
  const AttentionShape s{3, 101, 4, 2, 32, 0};
  const int64_t n_qkv = int64_t{s.B} * s.T * s.qkv_row();
  static_assert(301 * 129 >= kParallelMinElems);
  const VecF qkv = test::randn(n_qkv, 53), cs = test::randn(s.T * s.HS / 2, 54),
             sn = test::randn(s.T * s.HS / 2, 55);
  const int I = 200;
  const VecF gu = test::randn(N * 2 * I, 56), gsw = test::randn(N * I, 57);
  expect_same(test::with_1_and_2_threads([&] {
    VecF out(N * C), rstd(N), dx = test::randn(N * C, 58), dw = test::randn(C, 59);
    rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6f);
    rmsnorm_backward(dx.data(), dw.data(), g.data(), x.data(), w.data(), rstd.data(), N, C);
    VecF q = qkv, dq = qkv;
    rope_forward(q.data(), cs.data(), sn.data(), s);
    rope_backward(dq.data(), cs.data(), sn.data(), s);
    VecF y(N * I), dgu(N * 2 * I);
    swiglu_forward(y.data(), gu.data(), N, I);
    swiglu_backward(dgu.data(), gsw.data(), gu.data(), N, I);
    return Outputs{out, rstd, dx, dw, q, dq, y, dgu};
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

TEST(ThreadIndependence, CrossEntropyShards) {
  // One shard [2048, 3072) of a vocabulary of 3048: 1000 real columns of 1024.
  const int64_t N = 37;
  const int Vl = 1024, real = 1000, v0 = 2048;
  static_assert(N * real >= kParallelMinElems);
  const VecF logits = test::randn(N * Vl, 43, 2.0f);
  std::vector<int32_t> t(N);
  for (int64_t i = 0; i < N; ++i) t[i] = i % 5 == 0 ? -1 : static_cast<int32_t>(i * 97 % 3048);
  expect_same(test::with_1_and_2_threads([&] {
    VecF stats(3 * N), loss(N), d = logits;
    crossentropy_shard_stats(stats.data(), logits.data(), t.data(), N, real, Vl, v0);
    for (int64_t n = 0; n < N; ++n) stats[n] += 0.5f;  // as if another shard held a larger max
    crossentropy_shard_sumexp(stats.data(), logits.data(), N, real, Vl);
    crossentropy_shard_finish(loss.data(), d.data(), t.data(), stats.data(), N, real, Vl, v0, 0.5f);
    return Outputs{stats, loss, d};
  }));
}

}  // namespace
}  // namespace zerod::cpu
