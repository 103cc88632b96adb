#include "kernels/cpu/cpu_backend.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/dtype.h"
#include "core/memory.h"
#include "kernel_test_util.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"

namespace zerod {
namespace {

using test::VecF;

TEST(CpuBackend, DescribesItself) {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    auto be = make_cpu_backend(dt);
    EXPECT_STREQ(be->name(), "cpu");
    EXPECT_EQ(be->compute_dtype(), dt);
    EXPECT_EQ(be->compute_elem_size(), 4u);  // fp32 storage whatever the dtype
  }
}

TEST(CpuBackend, AllocateChargesTheTrackerAndZeroes) {
  auto be = make_cpu_backend(DType::kF32);
  MemoryTracker tracker;
  {
    Buffer b = be->allocate(1000, MemCategory::kActivations, &tracker);
    EXPECT_EQ(tracker.current(MemCategory::kActivations), 1000);
    const auto* bytes = b.as<unsigned char>();
    for (int i = 0; i < 1000; ++i) ASSERT_EQ(bytes[i], 0);
    be->memset_zero(b.data(), 0);
  }
  EXPECT_EQ(tracker.current(MemCategory::kActivations), 0);
}

TEST(CpuBackend, RoundToComputeFollowsTheDtype) {
  const VecF x = test::randn(1001, 1000);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    auto be = make_cpu_backend(dt);
    VecF y = x;
    be->round_to_compute(y.data(), static_cast<int64_t>(y.size()));
    VecF z(x.size(), test::kNaN);
    be->cast_to_compute(z.data(), x.data(), static_cast<int64_t>(x.size()));
    EXPECT_TRUE(test::bitwise_equal(y, z));
    VecF back(x.size(), test::kNaN);
    be->cast_from_compute(back.data(), z.data(), static_cast<int64_t>(z.size()));
    EXPECT_TRUE(test::bitwise_equal(back, z));
    for (size_t i = 0; i < x.size(); ++i) {
      const float want = dt == DType::kF32    ? x[i]
                         : dt == DType::kBF16 ? round_bf16(x[i])
                                              : round_f16(x[i]);
      ASSERT_EQ(y[i], want) << dtype_name(dt) << " " << i;
    }
    if (dt != DType::kF32) {
      EXPECT_FALSE(test::bitwise_equal(x, y));
    }
  }
}

// The CPU backend does not fuse a matmul with its GELU (the models call the separate ops and
// round between them); the interface's fused ops, which a backend without its own fusion
// inherits, are exactly those separate ops.
TEST(CpuBackend, FusedMatmulGeluDefaultsAreTheSeparateOps) {
  auto be = make_cpu_backend(DType::kF32);
  EXPECT_FALSE(be->fuses_matmul_gelu());
  const int64_t N = 6;
  const int C = 5, OC = 7;
  const VecF inp = test::randn(N * C, 11), w = test::randn(int64_t{OC} * C, 12),
             b = test::randn(OC, 13);
  VecF pre(N * OC), out(N * OC), pre_ref(N * OC), out_ref(N * OC);
  be->matmul_gelu_forward(out.data(), pre.data(), inp.data(), w.data(), b.data(), N, C, OC);
  be->matmul_forward(pre_ref.data(), inp.data(), w.data(), b.data(), N, C, OC);
  be->gelu_forward(out_ref.data(), pre_ref.data(), N * OC);
  EXPECT_EQ(pre, pre_ref);
  EXPECT_EQ(out, out_ref);
  // Backward of a (N, OC) -> (N, C2) layer whose input was gelu(pre).
  const int C2 = 3;
  const VecF w2 = test::randn(int64_t{C2} * OC, 14), dout = test::randn(N * C2, 15);
  VecF dpre(N * OC), dw2(int64_t{C2} * OC, 0.5f), db2(C2, 0.25f);
  VecF dpre_ref(N * OC), dw2_ref = dw2, db2_ref = db2;
  be->matmul_backward_dgelu(dpre.data(), dw2.data(), db2.data(), dout.data(), out.data(), w2.data(),
                            pre.data(), N, OC, C2);
  be->matmul_backward(dpre_ref.data(), dw2_ref.data(), db2_ref.data(), dout.data(), out.data(),
                      w2.data(), N, OC, C2, false);
  be->gelu_backward(dpre_ref.data(), pre.data(), dpre_ref.data(), N * OC);
  EXPECT_EQ(dpre, dpre_ref);
  EXPECT_EQ(dw2, dw2_ref);
  EXPECT_EQ(db2, db2_ref);
  // (and the GELU did something: dpre is not the plain matmul gradient)
  VecF plain(N * OC), dw_tmp(int64_t{C2} * OC, 0.0f);
  be->matmul_backward(plain.data(), dw_tmp.data(), nullptr, dout.data(), out.data(), w2.data(), N,
                      OC, C2, false);
  EXPECT_NE(plain, dpre);
}

TEST(CpuBackend, OpsThroughTheInterfaceEqualTheFreeFunctions) {
  auto be = make_cpu_backend(DType::kBF16);
  const int64_t N = 9;
  const int C = 7, OC = 5;
  const VecF inp = test::randn(N * C, 1010), w = test::randn(OC * C, 1011),
             b = test::randn(OC, 1012);
  VecF out1(N * OC), out2(N * OC);
  // (bf16 mode's matrix products run on bf16 operands where the CPU can: bf16_gemm.h)
  const bool bf16_products = static_cast<cpu::CpuBackend*>(be.get())->bf16_products();
  be->matmul_forward(out1.data(), inp.data(), w.data(), b.data(), N, C, OC);
  cpu::matmul_forward(out2.data(), inp.data(), w.data(), b.data(), N, C, OC, bf16_products);
  EXPECT_TRUE(test::bitwise_equal(out1, out2));

  const VecF lw = test::randn(C, 1013), lb = test::randn(C, 1014);
  VecF y1(N * C), y2(N * C), m1(N), m2(N), r1(N), r2(N);
  be->layernorm_forward(y1.data(), m1.data(), r1.data(), inp.data(), lw.data(), lb.data(), N, C);
  cpu::layernorm_forward(y2.data(), m2.data(), r2.data(), inp.data(), lw.data(), lb.data(), N, C);
  EXPECT_TRUE(test::bitwise_equal(y1, y2));
  EXPECT_TRUE(test::bitwise_equal(r1, r2));

  // Fused residual + layernorm: the residual rounded to bf16, then the layernorm of that; also
  // with the residual written over its first input.
  const VecF other = test::randn(N * C, 1017);
  VecF res1(N * C), res2(N * C);
  be->residual_layernorm_forward(res1.data(), y1.data(), m1.data(), r1.data(), inp.data(),
                                 other.data(), lw.data(), lb.data(), N, C);
  for (int64_t i = 0; i < N * C; ++i) res2[i] = round_bf16(inp[i] + other[i]);
  cpu::layernorm_forward(y2.data(), m2.data(), r2.data(), res2.data(), lw.data(), lb.data(), N, C);
  EXPECT_TRUE(test::bitwise_equal(res1, res2));
  EXPECT_TRUE(test::bitwise_equal(y1, y2));
  EXPECT_TRUE(test::bitwise_equal(m1, m2));
  EXPECT_TRUE(test::bitwise_equal(r1, r2));
  VecF in_place = inp;
  be->residual_layernorm_forward(in_place.data(), y1.data(), m1.data(), r1.data(), in_place.data(),
                                 other.data(), lw.data(), lb.data(), N, C);
  EXPECT_TRUE(test::bitwise_equal(in_place, res2));
  EXPECT_TRUE(test::bitwise_equal(y1, y2));

  // The sum of squares and the optimizer's rounded copy (bf16 backend).
  EXPECT_DOUBLE_EQ(be->sum_squares(inp.data(), N * C), cpu::sum_squares(inp.data(), N * C));
  VecF master = test::randn(100, 1015), m(100, 0.0f), v(100, 0.0f), param(100, test::kNaN);
  const VecF grad = test::randn(100, 1016);
  AdamWParams P;
  be->optimizer_update(master.data(), m.data(), v.data(), grad.data(), param.data(), 100, P);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(param[i], round_bf16(master[i]));
}

TEST(CpuBackend, LlamaOpsThroughTheInterfaceEqualTheFreeFunctions) {
  auto be = make_cpu_backend(DType::kF32);
  const int64_t N = 9;
  const int C = 7, I = 6;
  const VecF x = test::randn(N * C, 1020), w = test::randn(C, 1021), g = test::randn(N * C, 1022);
  VecF y1(N * C), y2(N * C), r1(N), r2(N);
  be->rmsnorm_forward(y1.data(), r1.data(), x.data(), w.data(), N, C, 1e-5f);
  cpu::rmsnorm_forward(y2.data(), r2.data(), x.data(), w.data(), N, C, 1e-5f);
  EXPECT_TRUE(test::bitwise_equal(y1, y2));
  EXPECT_TRUE(test::bitwise_equal(r1, r2));
  VecF dx1(N * C, 1.0f), dx2 = dx1, dw1(C, 1.0f), dw2 = dw1;
  be->rmsnorm_backward(dx1.data(), dw1.data(), g.data(), x.data(), w.data(), r1.data(), N, C);
  cpu::rmsnorm_backward(dx2.data(), dw2.data(), g.data(), x.data(), w.data(), r2.data(), N, C);
  EXPECT_TRUE(test::bitwise_equal(dx1, dx2));
  EXPECT_TRUE(test::bitwise_equal(dw1, dw2));

  const AttentionShape s{2, 5, 4, 2, 8, 3};
  const int64_t nq = int64_t{s.B} * s.T * s.qkv_row(), no = int64_t{s.B} * s.T * s.out_row();
  const VecF qkv = test::randn(nq, 1023), cs = test::randn(s.T * s.HS / 2, 1024),
             sn = test::randn(s.T * s.HS / 2, 1025), dout = test::randn(no, 1026);
  VecF q1 = qkv, q2 = qkv;
  be->rope_forward(q1.data(), cs.data(), sn.data(), s);
  cpu::rope_forward(q2.data(), cs.data(), sn.data(), s);
  EXPECT_TRUE(test::bitwise_equal(q1, q2));
  EXPECT_FALSE(test::bitwise_equal(q1, qkv));
  be->rope_backward(q1.data(), cs.data(), sn.data(), s);
  cpu::rope_backward(q2.data(), cs.data(), sn.data(), s);
  EXPECT_TRUE(test::bitwise_equal(q1, q2));

  VecF o1(no), o2(no), l1(s.B * s.NH * s.T), l2(s.B * s.NH * s.T), d1(nq), d2(nq);
  be->attention_forward(o1.data(), l1.data(), qkv.data(), s);
  cpu::attention_forward(o2.data(), l2.data(), qkv.data(), s);
  EXPECT_TRUE(test::bitwise_equal(o1, o2));
  EXPECT_TRUE(test::bitwise_equal(l1, l2));
  be->attention_backward(d1.data(), dout.data(), qkv.data(), o1.data(), l1.data(), s);
  cpu::attention_backward(d2.data(), dout.data(), qkv.data(), o2.data(), l2.data(), s);
  EXPECT_TRUE(test::bitwise_equal(d1, d2));
  const int maxT = 8;
  VecF kc1(s.B * maxT * s.KVH * s.HS), kc2 = kc1, vc1 = kc1, vc2 = kc1;
  be->attention_kv_cache(o1.data(), qkv.data(), kc1.data(), vc1.data(), 1, maxT, s);
  cpu::attention_kv_cache(o2.data(), qkv.data(), kc2.data(), vc2.data(), 1, maxT, s);
  EXPECT_TRUE(test::bitwise_equal(o1, o2));
  EXPECT_TRUE(test::bitwise_equal(kc1, kc2));
  EXPECT_TRUE(test::bitwise_equal(vc1, vc2));

  const VecF gu = test::randn(N * 2 * I, 1027), gs = test::randn(N * I, 1028);
  VecF s1(N * I), s2(N * I), dg1(N * 2 * I), dg2(N * 2 * I);
  be->swiglu_forward(s1.data(), gu.data(), N, I);
  cpu::swiglu_forward(s2.data(), gu.data(), N, I);
  EXPECT_TRUE(test::bitwise_equal(s1, s2));
  be->swiglu_backward(dg1.data(), gs.data(), gu.data(), N, I);
  cpu::swiglu_backward(dg2.data(), gs.data(), gu.data(), N, I);
  EXPECT_TRUE(test::bitwise_equal(dg1, dg2));
}

}  // namespace
}  // namespace zerod
