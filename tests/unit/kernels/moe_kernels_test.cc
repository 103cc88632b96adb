// The mixture-of-experts kernels' own contracts (torch parity is moe_test.cc): no tokens, thread
// independence, the grouped matmul's bits against one matmul per expert, the multi-layer aux
// loss, the permutation's plan, and the refusals of bad options.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "kernels/backend.h"
#include "kernels/cpu/grouped_matmul.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/moe_permute.h"
#include "kernels/cpu/moe_router.h"
#include "tests/unit/kernels/kernel_test_util.h"

namespace zerod::cpu {
namespace {

using test::VecF;
using VecI = std::vector<int32_t>;
using VecL = std::vector<int64_t>;

MoeRouterOptions options(int E, int k, bool drop, MoeDropPolicy policy = MoeDropPolicy::kProbs) {
  MoeRouterOptions o;
  o.num_experts = E;
  o.top_k = k;
  o.drop_tokens = drop;
  o.capacity_factor = 1.0;
  o.drop_policy = policy;
  return o;
}

struct RouterRun {
  VecF probs, lse, weight, dlogits;
  VecI expert;
  VecL aux_counts, kept;
  std::vector<double> prob_sum;
  MoeRouterStats stats;
};

RouterRun run_router(const VecF& logits, int64_t N, const MoeRouterOptions& o) {
  const auto E = static_cast<size_t>(o.num_experts), Nk = static_cast<size_t>(N * o.top_k);
  RouterRun r{VecF(logits.size()),
              VecF(static_cast<size_t>(N)),
              VecF(Nk),
              VecF(logits.size()),
              VecI(Nk),
              VecL(E),
              VecL(E),
              std::vector<double>(E),
              {}};
  r.stats = moe_router_forward(r.probs.data(), r.lse.data(), r.expert.data(), r.weight.data(),
                               r.aux_counts.data(), r.kept.data(), r.prob_sum.data(), logits.data(),
                               N, o);
  const VecF dweight = test::randn(static_cast<int64_t>(Nk), 77);
  MoeRouterLossGrad lg{0.01f, r.aux_counts.data(), N, 0.001f};
  moe_router_backward(r.dlogits.data(), dweight.data(), r.probs.data(), r.lse.data(),
                      r.expert.data(), N, o, lg);
  return r;
}

TEST(MoeKernels, NoTokens) {
  const MoeRouterOptions o = options(4, 2, true);
  const RouterRun r = run_router({}, 0, o);
  EXPECT_EQ(r.stats.aux_loss, 0.0);
  EXPECT_EQ(r.stats.z_loss, 0.0);
  EXPECT_EQ(r.stats.dropped, 0);
  EXPECT_EQ(r.kept, VecL(4, 0));
  VecL offsets(5, -1);
  EXPECT_EQ(moe_permute_plan(offsets.data(), nullptr, nullptr, nullptr, 0, 2, 4), 0);
  EXPECT_EQ(offsets, VecL(5, 0));
  VecF dw(4 * 3 * 2, 1.0f);
  grouped_matmul_forward(nullptr, nullptr, dw.data(), nullptr, offsets.data(), 4, 2, 3);
  grouped_matmul_backward(nullptr, dw.data(), nullptr, nullptr, nullptr, dw.data(), offsets.data(),
                          4, 2, 3, false);
  EXPECT_EQ(dw, VecF(24, 1.0f));  // untouched
}

TEST(MoeKernels, RouterIsThreadCountIndependent) {
  const int64_t N = 8192;  // N * E above the parallel threshold
  for (auto policy : {MoeDropPolicy::kProbs, MoeDropPolicy::kPosition}) {
    const MoeRouterOptions o = options(8, 2, true, policy);
    const VecF logits = test::randn(N * 8, 5, 2.0f);
    const auto [one, two] = test::with_1_and_2_threads([&] { return run_router(logits, N, o); });
    EXPECT_TRUE(test::bitwise_equal(one.probs, two.probs));
    EXPECT_TRUE(test::bitwise_equal(one.weight, two.weight));
    EXPECT_TRUE(test::bitwise_equal(one.dlogits, two.dlogits));
    EXPECT_EQ(one.expert, two.expert);
    EXPECT_EQ(one.stats.aux_loss, two.stats.aux_loss);
    EXPECT_EQ(one.stats.z_loss, two.stats.z_loss);
    EXPECT_GT(one.stats.dropped, 0);
  }
}

// Hugging Face's Mixtral takes one aux loss over every layer's logits concatenated: the summed
// counts and probability sums of the layers give the same number.
TEST(MoeKernels, AuxLossOverLayersFromSums) {
  const int E = 6, k = 2;
  const int64_t N = 37;
  const MoeRouterOptions o = options(E, k, false);
  const VecF a = test::randn(N * E, 1), b = test::randn(N * E, 2, 3.0f);
  VecF both(a);
  both.insert(both.end(), b.begin(), b.end());
  const RouterRun ra = run_router(a, N, o), rb = run_router(b, N, o),
                  rboth = run_router(both, 2 * N, o);
  VecL aux_counts(E);
  std::vector<double> psum(E);
  for (int e = 0; e < E; ++e) {
    aux_counts[e] = ra.aux_counts[e] + rb.aux_counts[e];
    psum[e] = ra.prob_sum[e] + rb.prob_sum[e];
  }
  EXPECT_NEAR(moe_load_balancing_loss(aux_counts.data(), psum.data(), 2 * N, o),
              rboth.stats.aux_loss, 1e-12);
  EXPECT_NE(rboth.stats.aux_loss, (ra.stats.aux_loss + rb.stats.aux_loss) / 2);  // not the mean
}

TEST(MoeKernels, PermutePlanIsStableByExpert) {
  // 5 tokens, k = 2, 3 experts; -1 = dropped.
  const VecI expert = {2, 0, 0, -1, 1, 2, 2, 0, -1, -1};
  VecL offsets(4);
  VecI row_token(10), slot_row(10);
  const int64_t R =
      moe_permute_plan(offsets.data(), row_token.data(), slot_row.data(), expert.data(), 5, 2, 3);
  EXPECT_EQ(R, 7);
  EXPECT_EQ(offsets, (VecL{0, 3, 4, 7}));
  row_token.resize(7);
  EXPECT_EQ(row_token, (VecI{0, 1, 3, 2, 0, 2, 3}));
  EXPECT_EQ(slot_row, (VecI{4, 0, 1, -1, 3, 5, 6, 2, -1, -1}));
  const VecI bad = {0, 3};
  EXPECT_THROW(
      moe_permute_plan(offsets.data(), row_token.data(), slot_row.data(), bad.data(), 1, 2, 3),
      Error);
}

// Each expert's block is exactly a matmul of its rows (bits), empty experts keep their weight
// gradients, accumulate_dinp adds, and any thread count gives the same bits.
TEST(MoeKernels, GroupedMatmulIsOneMatmulPerExpert) {
  const int E = 5, C = 48, OC = 40;
  const VecL offsets = {0, 70, 70, 71, 200, 200};  // experts 1 and 4 empty
  const int64_t R = offsets[E];
  const VecF x = test::randn(R * C, 1), w = test::randn(int64_t{E} * OC * C, 2, 0.1f),
             b = test::randn(int64_t{E} * OC, 3), dy = test::randn(R * OC, 4);
  struct Out {
    VecF y, dx, dw, db;
  };
  auto grouped = [&] {
    Out o{VecF(R * OC), VecF(R * C, 1.0f), VecF(w.size(), 0.5f), VecF(b.size(), 0.25f)};
    grouped_matmul_forward(o.y.data(), x.data(), w.data(), b.data(), offsets.data(), E, C, OC);
    grouped_matmul_backward(o.dx.data(), o.dw.data(), o.db.data(), dy.data(), x.data(), w.data(),
                            offsets.data(), E, C, OC, /*accumulate_dinp=*/true);
    return o;
  };
  const auto [one, two] = test::with_1_and_2_threads(grouped);
  EXPECT_TRUE(test::bitwise_equal(one.y, two.y));
  EXPECT_TRUE(test::bitwise_equal(one.dx, two.dx));
  EXPECT_TRUE(test::bitwise_equal(one.dw, two.dw));
  EXPECT_TRUE(test::bitwise_equal(one.db, two.db));

  Out ref{VecF(R * OC), VecF(R * C, 1.0f), VecF(w.size(), 0.5f), VecF(b.size(), 0.25f)};
  for (int e = 0; e < E; ++e) {
    const int64_t r0 = offsets[e], n = offsets[e + 1] - r0;
    if (n == 0) continue;
    matmul_forward(ref.y.data() + r0 * OC, x.data() + r0 * C, w.data() + e * OC * C,
                   b.data() + e * OC, n, C, OC);
    matmul_backward(ref.dx.data() + r0 * C, ref.dw.data() + e * OC * C, ref.db.data() + e * OC,
                    dy.data() + r0 * OC, x.data() + r0 * C, w.data() + e * OC * C, n, C, OC, true);
  }
  EXPECT_TRUE(test::bitwise_equal(one.y, ref.y));
  EXPECT_TRUE(test::bitwise_equal(one.dx, ref.dx));
  EXPECT_TRUE(test::bitwise_equal(one.dw, ref.dw));
  EXPECT_TRUE(test::bitwise_equal(one.db, ref.db));
  for (int e : {1, 4}) {
    EXPECT_TRUE(std::all_of(one.dw.begin() + e * OC * C, one.dw.begin() + (e + 1) * OC * C,
                            [](float v) { return v == 0.5f; }));
  }

  // Experts stored expert by expert (a model's experts unit): each expert's weight then bias in
  // one block of `stride` elements, gaps included. The same bits, and the gaps untouched.
  const int64_t stride = int64_t{OC} * C + OC + 8;
  VecF ws(E * stride, 7.0f), dws(E * stride, 0.5f);
  for (int e = 0; e < E; ++e) {
    std::copy(w.begin() + e * OC * C, w.begin() + (e + 1) * OC * C, ws.begin() + e * stride);
    std::copy(b.begin() + e * OC, b.begin() + (e + 1) * OC, ws.begin() + e * stride + OC * C);
    std::fill(dws.begin() + e * stride + OC * C, dws.begin() + e * stride + OC * C + OC, 0.25f);
  }
  VecF ys(R * OC), dxs(R * C, 1.0f);
  grouped_matmul_forward(ys.data(), x.data(), ws.data(), ws.data() + OC * C, offsets.data(), E, C,
                         OC, false, stride, stride);
  grouped_matmul_backward(dxs.data(), dws.data(), dws.data() + OC * C, dy.data(), x.data(),
                          ws.data(), offsets.data(), E, C, OC, true, false, stride, stride);
  EXPECT_TRUE(test::bitwise_equal(ys, ref.y));
  EXPECT_TRUE(test::bitwise_equal(dxs, ref.dx));
  for (int e = 0; e < E; ++e) {
    const auto block = dws.begin() + e * stride;
    EXPECT_TRUE(
        test::bitwise_equal(VecF(block, block + OC * C),
                            VecF(ref.dw.begin() + e * OC * C, ref.dw.begin() + (e + 1) * OC * C)));
    EXPECT_TRUE(test::bitwise_equal(VecF(block + OC * C, block + OC * C + OC),
                                    VecF(ref.db.begin() + e * OC, ref.db.begin() + (e + 1) * OC)));
    EXPECT_TRUE(
        std::all_of(block + OC * C + OC, block + stride, [](float v) { return v == 0.5f; }));
  }
  const VecL decreasing = {0, 10, 5, 6, 7, 8};
  VecF y(R * OC);
  EXPECT_THROW(
      grouped_matmul_forward(y.data(), x.data(), w.data(), nullptr, decreasing.data(), E, C, OC),
      Error);
}

TEST(MoeKernels, BadOptionsAreInputErrors) {
  EXPECT_THROW(validate(options(0, 1, false)), InputError);
  EXPECT_THROW(validate(options(4, 5, false)), InputError);
  EXPECT_THROW(validate(options(4, 0, false)), InputError);
  MoeRouterOptions o = options(4, 2, true);
  o.capacity_factor = 0.0;
  EXPECT_THROW(validate(o), InputError);
  o.drop_tokens = false;
  EXPECT_NO_THROW(validate(o));  // dropless ignores the capacity factor
  o.min_capacity = -1;
  EXPECT_THROW(validate(o), InputError);
}

TEST(MoeKernels, CapacityIsDeepSpeedsFp32Formula) {
  MoeRouterOptions o = options(8, 2, true);
  o.capacity_factor = 1.25;
  EXPECT_EQ(moe_capacity(1000, o), 313);  // ceil(125 * 2.5 = 312.5)
  o.min_capacity = 400;
  EXPECT_EQ(moe_capacity(1000, o), 400);
  o = options(3, 1, true);
  o.capacity_factor = 1.2;
  // 35 / 3 * 1.2 = 14 exactly, and in double; DeepSpeed's fp32 product rounds above 14 (torch
  // 1.13: torch.ceil((35 / 3) * torch.tensor(1.2)) = 15).
  EXPECT_EQ(moe_capacity(35, o), 15);
}

// The Backend ops of the CPU backend are the kernels above, and in bf16 mode the grouped matmul
// multiplies as the backend's matmul does (bf16 products where this machine has them).
TEST(MoeKernels, CpuBackendOpsAreTheKernels) {
  const int E = 3, k = 2, C = 32, OC = 24;
  const int64_t N = 50;
  const MoeRouterOptions o = options(E, k, true);
  const VecF logits = test::randn(N * E, 11), x = test::randn(N * C, 12),
             w = test::randn(int64_t{E} * OC * C, 13, 0.1f), dy = test::randn(N * OC, 14);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    auto be = make_cpu_backend(dt);
    VecF probs(N * E), lse(N), weight(N * k), dlogits(N * E);
    VecI expert(N * k), row_token(N * k), slot_row(N * k);
    VecL aux_counts(E), kept(E), offsets(E + 1);
    const MoeRouterStats st =
        be->moe_router_forward(probs.data(), lse.data(), expert.data(), weight.data(),
                               aux_counts.data(), kept.data(), logits.data(), N, o);
    const RouterRun ref = run_router(logits, N, o);
    EXPECT_EQ(expert, ref.expert);
    EXPECT_TRUE(test::bitwise_equal(weight, ref.weight));
    EXPECT_EQ(st.aux_loss, ref.stats.aux_loss);
    const int64_t R = be->moe_permute_plan(offsets.data(), row_token.data(), slot_row.data(),
                                           expert.data(), N, k, E);
    VecF xp(R * C), yp(R * OC), y(N * OC), dyp(R * OC), dweight(N * k), dxp(R * C), dx(N * C, 0.0f),
        dw(w.size(), 0.0f);
    be->moe_permute_forward(xp.data(), x.data(), row_token.data(), R, C);
    be->grouped_matmul_forward(yp.data(), xp.data(), w.data(), nullptr, offsets.data(), E, C, OC, 0,
                               0);
    be->moe_unpermute_forward(y.data(), yp.data(), weight.data(), slot_row.data(), N, k, OC);
    be->moe_unpermute_backward(dyp.data(), dweight.data(), dy.data(), yp.data(), weight.data(),
                               slot_row.data(), N, k, OC);
    be->grouped_matmul_backward(dxp.data(), dw.data(), nullptr, dyp.data(), xp.data(), w.data(),
                                offsets.data(), E, C, OC, false, 0, 0);
    be->moe_permute_backward(dx.data(), dxp.data(), slot_row.data(), N, k, C);
    MoeRouterLossGrad lg{0.01f, aux_counts.data(), N, 0.001f};
    be->moe_router_backward(dlogits.data(), dweight.data(), probs.data(), lse.data(), expert.data(),
                            N, o, lg);

    // The same through the backend's matmul per expert and the kernels.
    VecF yp2(R * OC), y2(N * OC), dyp2(R * OC), dweight2(N * k), dxp2(R * C), dx2(N * C, 0.0f),
        dw2(w.size(), 0.0f), dlogits2(N * E);
    for (int e = 0; e < E; ++e) {
      const int64_t r0 = offsets[e], n = offsets[e + 1] - r0;
      if (n == 0) continue;
      be->matmul_forward(yp2.data() + r0 * OC, xp.data() + r0 * C, w.data() + e * OC * C, nullptr,
                         n, C, OC);
    }
    moe_unpermute_forward(y2.data(), yp2.data(), weight.data(), slot_row.data(), N, k, OC);
    moe_unpermute_backward(dyp2.data(), dweight2.data(), dy.data(), yp2.data(), weight.data(),
                           slot_row.data(), N, k, OC);
    for (int e = 0; e < E; ++e) {
      const int64_t r0 = offsets[e], n = offsets[e + 1] - r0;
      if (n == 0) continue;
      be->matmul_backward(dxp2.data() + r0 * C, dw2.data() + e * OC * C, nullptr,
                          dyp2.data() + r0 * OC, xp.data() + r0 * C, w.data() + e * OC * C, n, C,
                          OC, false);
    }
    moe_permute_backward(dx2.data(), dxp2.data(), slot_row.data(), N, k, C);
    moe_router_backward(dlogits2.data(), dweight2.data(), probs.data(), lse.data(), expert.data(),
                        N, o, lg);
    const std::string what = dt == DType::kF32 ? "fp32" : "bf16";
    EXPECT_TRUE(test::bitwise_equal(y, y2)) << what;
    EXPECT_TRUE(test::bitwise_equal(dx, dx2)) << what;
    EXPECT_TRUE(test::bitwise_equal(dw, dw2)) << what;
    EXPECT_TRUE(test::bitwise_equal(dlogits, dlogits2)) << what;
  }
}

}  // namespace
}  // namespace zerod::cpu
