// GELU, residual, scale, sum of squares and AdamW of the CUDA backend against the CPU reference
// (metric and limits: cuda_test_util.h). Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_util.h"

namespace zerod {
namespace {

using test::Backends;
using test::VecF;

constexpr int64_t kN = 100003;  // not a multiple of any block size

TEST(CudaElementwise, GeluForwardAndBackwardMatchTheCpu) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  for (DType dt : test::kAllDtypes) {
    SCOPED_TRACE(dtype_name(dt));
    Backends be(dt);
    const VecF x = be.round(test::randn(kN, 10, 3.0f));
    const VecF g = be.round(test::randn(kN, 11));
    VecF want(kN), want_d(kN);
    be.cpu->gelu_forward(want.data(), x.data(), kN);
    be.cpu->gelu_backward(want_d.data(), x.data(), g.data(), kN);
    Buffer dx = be.compute(x), dg = be.compute(g);
    Buffer out = be.poisoned_compute(kN), dinp = be.poisoned_compute(kN);
    be.gpu->gelu_forward(out.data(), dx.data(), kN);
    be.gpu->gelu_backward(dinp.data(), dx.data(), dg.data(), kN);
    EXPECT_TRUE(test::close(be.read_compute(out, kN), want, test::tolerance(dt)));
    EXPECT_TRUE(test::close(be.read_compute(dinp, kN), want_d, test::tolerance(dt)));
    // Tensors that are not 16-byte aligned (element by element, not in 16-byte packs): from the
    // second element on.
    Buffer out1 = be.poisoned_compute(kN);
    const size_t e = be.gpu->compute_elem_size();
    be.gpu->gelu_forward(static_cast<char*>(out1.data()) + e, static_cast<char*>(dx.data()) + e,
                         kN - 1);
    const VecF shifted = be.read_compute(out1, kN);
    EXPECT_TRUE(std::isnan(shifted[0])) << "element 0 written";
    EXPECT_TRUE(test::close(VecF(shifted.begin() + 1, shifted.end()),
                            VecF(want.begin() + 1, want.end()), test::tolerance(dt)));
    // In place (dinp aliasing dout), as a model may call it.
    be.gpu->gelu_backward(dg.data(), dx.data(), dg.data(), kN);
    EXPECT_TRUE(test::close(be.read_compute(dg, kN), want_d, test::tolerance(dt)));
  }
}

TEST(CudaElementwise, ResidualAndScaleMatchTheCpu) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  for (DType dt : test::kAllDtypes) {
    SCOPED_TRACE(dtype_name(dt));
    Backends be(dt);
    const VecF a = be.round(test::randn(kN, 20)), b = be.round(test::randn(kN, 21));
    VecF want(kN);
    be.cpu->residual_forward(want.data(), a.data(), b.data(), kN);
    Buffer da = be.compute(a), db = be.compute(b), out = be.poisoned_compute(kN);
    be.gpu->residual_forward(out.data(), da.data(), db.data(), kN);
    EXPECT_TRUE(test::close(be.read_compute(out, kN), want, test::tolerance(dt)));

    VecF scaled = a;
    be.cpu->scale(scaled.data(), 0.37f, kN);
    be.gpu->scale(da.data(), 0.37f, kN);
    EXPECT_TRUE(test::close(be.read_compute(da, kN), scaled, test::tolerance(dt)));
  }
}

TEST(CudaElementwise, SumSquaresMatchesTheCpuAndPropagatesInfAndNaN) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  for (DType dt : test::kAllDtypes) {
    SCOPED_TRACE(dtype_name(dt));
    Backends be(dt);
    for (int64_t n : {int64_t{1}, int64_t{255}, kN, int64_t{1} << 20}) {
      const VecF x = be.round(test::randn(n, 30 + n));
      const double want = be.cpu->sum_squares(x.data(), n);
      Buffer dx = be.compute(x);
      const double got = be.gpu->sum_squares(dx.data(), n);
      EXPECT_NEAR(got, want, 1e-12 * want) << n;  // both in double: only the order differs
    }
    EXPECT_EQ(be.gpu->sum_squares(nullptr, 0), 0.0);
    VecF x = be.round(test::randn(1000, 39));
    x[517] = std::numeric_limits<float>::infinity();
    Buffer dx = be.compute(x);
    EXPECT_TRUE(std::isinf(be.gpu->sum_squares(dx.data(), 1000)));
    x[3] = std::numeric_limits<float>::quiet_NaN();
    Buffer dn = be.compute(x);
    EXPECT_TRUE(std::isnan(be.gpu->sum_squares(dn.data(), 1000)));
  }
}

// The pieces call reads every piece's partials back at once: bitwise the sum of the per-piece
// calls, in order (an empty piece included), on the scratch the single calls also use.
TEST(CudaElementwise, SumSquaresOfPiecesEqualsThePerPieceSum) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  for (DType dt : test::kAllDtypes) {
    SCOPED_TRACE(dtype_name(dt));
    Backends be(dt);
    const std::vector<int64_t> sizes = {300000, 1, 0, 4097, int64_t{1} << 21, 77};
    std::vector<Buffer> bufs;
    std::vector<std::pair<const void*, int64_t>> pieces;
    double want = 0.0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const int64_t n = sizes[i];
      bufs.push_back(be.compute(be.round(test::randn(n == 0 ? 1 : n, 50 + static_cast<int>(i)))));
      pieces.emplace_back(bufs.back().data(), n);
      want += be.gpu->sum_squares(bufs.back().data(), n);
    }
    EXPECT_EQ(be.gpu->sum_squares_pieces(pieces), want);
    EXPECT_EQ(be.gpu->sum_squares_pieces({}), 0.0);
    VecF x = be.round(test::randn(1000, 59));
    x[999] = std::numeric_limits<float>::infinity();
    Buffer dx = be.compute(x);
    pieces.emplace_back(dx.data(), 1000);
    EXPECT_TRUE(std::isinf(be.gpu->sum_squares_pieces(pieces)));
  }
}

TEST(CudaElementwise, AdamWMatchesTheCpuInEveryMode) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  AdamWParams modes[3];
  modes[0].weight_decay = 0.1f;  // AdamW, decoupled decay
  modes[0].grad_scale = 0.5f;
  modes[0].step = 3;
  modes[1].weight_decay = 0.01f;  // Adam with L2
  modes[1].adam_w_mode = false;
  modes[1].lr = 3e-4f;
  modes[2].bias_correction = false;  // no decay, no bias correction
  modes[2].step = 7;
  for (DType dt : test::kAllDtypes) {
    for (int mode = 0; mode < 3; ++mode) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " mode " + std::to_string(mode));
      Backends be(dt);
      const AdamWParams& p = modes[mode];
      VecF master = test::randn(kN, 40), m = test::randn(kN, 41, 0.1f);
      VecF v = test::randn(kN, 42, 0.01f);
      for (auto& x : v) x = std::fabs(x);
      const VecF grad = be.round(test::randn(kN, 43));
      Buffer d_master = be.f32(master), d_m = be.f32(m), d_v = be.f32(v);
      Buffer d_grad = be.compute(grad), d_param = be.poisoned_compute(kN);
      VecF param(kN);
      be.cpu->optimizer_update(master.data(), m.data(), v.data(), grad.data(), param.data(), kN, p);
      be.gpu->optimizer_update(d_master.as<float>(), d_m.as<float>(), d_v.as<float>(),
                               d_grad.data(), d_param.data(), kN, p);
      EXPECT_TRUE(test::close(be.read_f32(d_master, kN), master, 1e-6));
      EXPECT_TRUE(test::close(be.read_f32(d_m, kN), m, 1e-6));
      EXPECT_TRUE(test::close(be.read_f32(d_v, kN), v, 1e-6));
      EXPECT_TRUE(test::close(be.read_compute(d_param, kN), param, test::tolerance(dt)));
      // Without param_out: the states only.
      be.cpu->optimizer_update(master.data(), m.data(), v.data(), grad.data(), nullptr, kN, p);
      be.gpu->optimizer_update(d_master.as<float>(), d_m.as<float>(), d_v.as<float>(),
                               d_grad.data(), nullptr, kN, p);
      EXPECT_TRUE(test::close(be.read_f32(d_master, kN), master, 1e-6));
    }
  }
}

// SGD (plain, momentum with dampening, Nesterov), Adagrad and Lion: the GPU kernels do the CPU's
// operations in the CPU's order, so the fp32 states agree bit for bit, over the first step (the
// buffer and the sum start) and the ones after it.
TEST(CudaElementwise, SgdAdagradLionMatchTheCpuBitwise) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  OptimizerParams modes[5];
  modes[0].kind = OptimizerKind::kSgd;
  modes[0].lr = 0.05;
  modes[0].weight_decay = 0.01;
  modes[1] = modes[0];
  modes[1].momentum = 0.9;
  modes[1].dampening = 0.3;
  modes[1].grad_scale = 0.5f;
  modes[2] = modes[0];
  modes[2].momentum = 0.8;
  modes[2].nesterov = true;
  modes[3].kind = OptimizerKind::kAdagrad;
  modes[3].lr = 0.05;
  modes[3].lr_decay = 0.01;
  modes[3].initial_accumulator_value = 0.1;
  modes[3].eps = 1e-10;
  modes[3].weight_decay = 0.01;
  modes[4].kind = OptimizerKind::kLion;
  modes[4].lr = 1e-3;
  modes[4].beta2 = 0.99;
  modes[4].weight_decay = 0.1;
  for (DType dt : test::kAllDtypes) {
    for (int mode = 0; mode < 5; ++mode) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " mode " + std::to_string(mode));
      Backends be(dt);
      OptimizerParams p = modes[mode];
      VecF master = test::randn(kN, 50), m(kN, 0.0f), v(kN, 0.0f);
      Buffer d_master = be.f32(master), d_m = be.f32(m), d_v = be.f32(v);
      Buffer d_param = be.poisoned_compute(kN);
      VecF param(kN);
      for (int64_t step = 1; step <= 3; ++step) {
        p.step = step;
        const VecF grad = be.round(test::randn(kN, 51 + static_cast<uint64_t>(step)));
        Buffer d_grad = be.compute(grad);
        be.cpu->optimizer_update(master.data(), m.data(), v.data(), grad.data(), param.data(), kN,
                                 p);
        be.gpu->optimizer_update(d_master.as<float>(), d_m.as<float>(), d_v.as<float>(),
                                 d_grad.data(), d_param.data(), kN, p);
      }
      EXPECT_EQ(be.read_f32(d_master, kN), master);
      EXPECT_EQ(be.read_f32(d_m, kN), m);
      EXPECT_EQ(be.read_f32(d_v, kN), v);
      EXPECT_TRUE(test::close(be.read_compute(d_param, kN), param, test::tolerance(dt)));
    }
  }
}

}  // namespace
}  // namespace zerod
