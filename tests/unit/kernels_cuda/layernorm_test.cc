// Layer normalisation of the CUDA backend against the CPU reference (metric and limits:
// cuda_test_util.h). Skips without a GPU.
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "cuda_test_util.h"
#include "kernels/cuda/layernorm.h"

namespace zerod {
namespace {

using test::Backends;
using test::VecF;

struct Shape {
  int64_t N;
  int C;
};
// C = 771: the element-wise kernels (not whole 16-byte packs); the others the packed ones, with
// 1 (48, 64), 4 (768: GPT-2), 8 (1600: GPT-2 XL, the last packs of the row on some lanes only)
// and 16 (4096: Llama 7B; fp32: 32 packs a lane is past the packed path) packs of the row a lane.
constexpr Shape kShapes[] = {{37, 48}, {300, 771}, {2048, 64}, {513, 768}, {67, 1600}, {9, 4096}};

TEST(CudaLayerNorm, ForwardMatchesTheCpu) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  for (DType dt : test::kAllDtypes) {
    for (const Shape& s : kShapes) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " N=" + std::to_string(s.N) +
                   " C=" + std::to_string(s.C));
      Backends be(dt);
      const int64_t NC = s.N * s.C;
      const VecF inp = be.round(test::randn(NC, 50, 2.0f, 0.5f));
      const VecF w = be.round(test::randn(s.C, 51)), b = be.round(test::randn(s.C, 52));
      VecF out(NC), mean(s.N), rstd(s.N);
      be.cpu->layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(),
                                b.data(), s.N, s.C);
      Buffer d_inp = be.compute(inp), d_w = be.compute(w), d_b = be.compute(b);
      Buffer d_out = be.poisoned_compute(NC);
      Buffer d_mean = be.poisoned_f32(s.N), d_rstd = be.poisoned_f32(s.N);
      be.gpu->layernorm_forward(d_out.data(), d_mean.as<float>(), d_rstd.as<float>(), d_inp.data(),
                                d_w.data(), d_b.data(), s.N, s.C);
      EXPECT_TRUE(test::close(be.read_compute(d_out, NC), out, test::tolerance(dt)));
      EXPECT_TRUE(test::close(be.read_f32(d_mean, s.N), mean, 1e-5));  // fp32 both sides
      EXPECT_TRUE(test::close(be.read_f32(d_rstd, s.N), rstd, 1e-5));
    }
  }
}

// The fused residual + layernorm against the CPU's (residual, rounding, layernorm), also in place
// (the residual written over its first input).
TEST(CudaLayerNorm, FusedResidualForwardMatchesTheCpu) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  for (DType dt : test::kAllDtypes) {
    for (const Shape& s : kShapes) {
      for (const bool in_place : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " N=" + std::to_string(s.N) +
                     " C=" + std::to_string(s.C) + (in_place ? " in place" : ""));
        Backends be(dt);
        const int64_t NC = s.N * s.C;
        const VecF a = be.round(test::randn(NC, 70, 2.0f, 0.5f));
        const VecF b = be.round(test::randn(NC, 71));
        const VecF w = be.round(test::randn(s.C, 72)), bias = be.round(test::randn(s.C, 73));
        VecF res(NC), out(NC), mean(s.N), rstd(s.N);
        be.cpu->residual_layernorm_forward(res.data(), out.data(), mean.data(), rstd.data(),
                                           a.data(), b.data(), w.data(), bias.data(), s.N, s.C);
        Buffer d_a = be.compute(a), d_b = be.compute(b), d_w = be.compute(w),
               d_bias = be.compute(bias);
        Buffer d_res = be.poisoned_compute(NC), d_out = be.poisoned_compute(NC);
        Buffer d_mean = be.poisoned_f32(s.N), d_rstd = be.poisoned_f32(s.N);
        void* res_ptr = in_place ? d_a.data() : d_res.data();
        be.gpu->residual_layernorm_forward(res_ptr, d_out.data(), d_mean.as<float>(),
                                           d_rstd.as<float>(), d_a.data(), d_b.data(), d_w.data(),
                                           d_bias.data(), s.N, s.C);
        Buffer& got_res = in_place ? d_a : d_res;
        // The residual is one rounding of the same sum on both sides.
        EXPECT_TRUE(test::close(be.read_compute(got_res, NC), res, 1e-6));
        EXPECT_TRUE(test::close(be.read_compute(d_out, NC), out, test::tolerance(dt)));
        EXPECT_TRUE(test::close(be.read_f32(d_mean, s.N), mean, 1e-5));
        EXPECT_TRUE(test::close(be.read_f32(d_rstd, s.N), rstd, 1e-5));
      }
    }
  }
}

// The inputs of a backward call: inp (seed), weight (seed + 1) and dout (seed + 2) rounded to
// the dtype, the CPU forward's mean and rstd (zero bias), and their device copies.
struct BackwardInputs {
  VecF inp, w, dout, mean, rstd;
  Buffer d_inp, d_w, d_dout, d_mean, d_rstd;
};

BackwardInputs backward_inputs(Backends& be, const Shape& s, uint64_t seed) {
  const int64_t NC = s.N * s.C;
  VecF inp = be.round(test::randn(NC, seed, 2.0f, 0.5f));
  VecF w = be.round(test::randn(s.C, seed + 1));
  VecF dout = be.round(test::randn(NC, seed + 2));
  VecF mean(s.N), rstd(s.N), out(NC);
  const VecF zero_bias(s.C, 0.0f);
  be.cpu->layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(),
                            zero_bias.data(), s.N, s.C);
  Buffer d_inp = be.compute(inp), d_w = be.compute(w), d_dout = be.compute(dout);
  Buffer d_mean = be.f32(mean), d_rstd = be.f32(rstd);
  return {std::move(inp),    std::move(w),     std::move(dout), std::move(mean),
          std::move(rstd),   std::move(d_inp), std::move(d_w),  std::move(d_dout),
          std::move(d_mean), std::move(d_rstd)};
}

// Runs the body with layernorm_backward's fused dinp + weight/bias partials kernel allowed and
// not, restoring the setting after.
class CudaLayerNormGrads : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    before_ = cuda::layernorm_fused_gradients();
    cuda::set_layernorm_fused_gradients(GetParam());
  }
  void TearDown() override { cuda::set_layernorm_fused_gradients(before_); }
  bool before_ = true;
};

TEST_P(CudaLayerNormGrads, BackwardAccumulatesLikeTheCpu) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  for (DType dt : test::kAllDtypes) {
    for (const Shape& s : kShapes) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " N=" + std::to_string(s.N) +
                   " C=" + std::to_string(s.C));
      Backends be(dt);
      const int64_t NC = s.N * s.C;
      BackwardInputs x = backward_inputs(be, s, 60);
      // += outputs start from random values on both sides.
      VecF dinp = be.round(test::randn(NC, 63, 0.1f));
      VecF dw = be.round(test::randn(s.C, 64, 0.1f)), db = be.round(test::randn(s.C, 65, 0.1f));
      Buffer d_dinp = be.compute(dinp), d_dw = be.compute(dw), d_db = be.compute(db);
      be.cpu->layernorm_backward(dinp.data(), dw.data(), db.data(), x.dout.data(), x.inp.data(),
                                 x.w.data(), x.mean.data(), x.rstd.data(), s.N, s.C);
      be.gpu->layernorm_backward(d_dinp.data(), d_dw.data(), d_db.data(), x.d_dout.data(),
                                 x.d_inp.data(), x.d_w.data(), x.d_mean.as<float>(),
                                 x.d_rstd.as<float>(), s.N, s.C);
      EXPECT_TRUE(test::close(be.read_compute(d_dinp, NC), dinp, test::tolerance(dt)));
      EXPECT_TRUE(test::close(be.read_compute(d_dw, s.C), dw, test::tolerance(dt)));
      EXPECT_TRUE(test::close(be.read_compute(d_db, s.C), db, test::tolerance(dt)));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Grads, CudaLayerNormGrads, ::testing::Values(true, false),
                         [](const auto& info) {
                           return std::string(info.param ? "fused" : "separate");
                         });

// The fused kernel (rows of 1 to 3 packs a lane, blocks walking several rows each) against the
// separate kernels: dinp bit for bit (the same arithmetic), dweight and dbias within rounding
// (another summation order), from the same += starting values.
TEST(CudaLayerNorm, FusedGradientsEqualTheSeparateKernels) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  const bool before = cuda::layernorm_fused_gradients();
  constexpr Shape kFusedShapes[] = {{5000, 768}, {3001, 384}, {70, 128}, {2113, 256}};
  for (DType dt : test::kAllDtypes) {
    for (const Shape& s : kFusedShapes) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " N=" + std::to_string(s.N) +
                   " C=" + std::to_string(s.C));
      Backends be(dt);
      const int64_t NC = s.N * s.C;
      const BackwardInputs x = backward_inputs(be, s, 70);
      const VecF dinp0 = be.round(test::randn(NC, 73, 0.1f));
      const VecF dw0 = be.round(test::randn(s.C, 74, 0.1f)), db0 = be.round(test::randn(s.C, 75));
      VecF dinp[2], dw[2], db[2];
      for (int fused = 0; fused < 2; ++fused) {
        cuda::set_layernorm_fused_gradients(fused == 1);
        Buffer d_dinp = be.compute(dinp0), d_dw = be.compute(dw0), d_db = be.compute(db0);
        be.gpu->layernorm_backward(d_dinp.data(), d_dw.data(), d_db.data(), x.d_dout.data(),
                                   x.d_inp.data(), x.d_w.data(), x.d_mean.as<float>(),
                                   x.d_rstd.as<float>(), s.N, s.C);
        dinp[fused] = be.read_compute(d_dinp, NC);
        dw[fused] = be.read_compute(d_dw, s.C);
        db[fused] = be.read_compute(d_db, s.C);
      }
      EXPECT_TRUE(dinp[0] == dinp[1]);
      EXPECT_TRUE(test::close(dw[1], dw[0], test::tolerance(dt)));
      EXPECT_TRUE(test::close(db[1], db[0], test::tolerance(dt)));
    }
  }
  cuda::set_layernorm_fused_gradients(before);
}

}  // namespace
}  // namespace zerod
