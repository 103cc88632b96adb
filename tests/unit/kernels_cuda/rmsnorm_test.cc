// RMS normalisation of the CUDA backend against the CPU reference (metric and limits:
// cuda_test_util.h). Skips without a GPU.
#include <gtest/gtest.h>

#include <string>

#include "cuda_test_util.h"

namespace zerod {
namespace {

using test::Backends;
using test::VecF;

struct Shape {
  int64_t N;
  int C;
  float eps;
};
// C below, not a multiple of, and a multiple of the 32 lanes; N across several row chunks of the
// deterministic dweight sum.
constexpr Shape kShapes[] = {{37, 48, 1e-5f}, {300, 771, 1e-6f}, {2048, 64, 1e-5f}, {5, 7, 1e-6f}};

std::string label(DType dt, const Shape& s) {
  return std::string(dtype_name(dt)) + " N=" + std::to_string(s.N) + " C=" + std::to_string(s.C);
}

TEST(CudaRmsNorm, ForwardMatchesTheCpu) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  for (DType dt : test::kAllDtypes) {
    for (const Shape& s : kShapes) {
      SCOPED_TRACE(label(dt, s));
      Backends be(dt);
      const int64_t NC = s.N * s.C;
      const VecF inp = be.round(test::randn(NC, 150, 2.0f, 0.5f));
      const VecF w = be.round(test::randn(s.C, 151, 0.5f, 1.0f));
      VecF out(NC), rstd(s.N);
      be.cpu->rmsnorm_forward(out.data(), rstd.data(), inp.data(), w.data(), s.N, s.C, s.eps);
      Buffer d_inp = be.compute(inp), d_w = be.compute(w);
      Buffer d_out = be.poisoned_compute(NC), d_rstd = be.poisoned_f32(s.N);
      be.gpu->rmsnorm_forward(d_out.data(), d_rstd.as<float>(), d_inp.data(), d_w.data(), s.N, s.C,
                              s.eps);
      EXPECT_TRUE(test::close(be.read_compute(d_out, NC), out, test::tolerance(dt)));
      EXPECT_TRUE(test::close(be.read_f32(d_rstd, s.N), rstd, 1e-5));  // fp32 both sides
    }
  }
}

TEST(CudaRmsNorm, BackwardAccumulatesLikeTheCpu) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  for (DType dt : test::kAllDtypes) {
    for (const Shape& s : kShapes) {
      SCOPED_TRACE(label(dt, s));
      Backends be(dt);
      const int64_t NC = s.N * s.C;
      const VecF inp = be.round(test::randn(NC, 160, 2.0f, 0.5f));
      const VecF w = be.round(test::randn(s.C, 161, 0.5f, 1.0f));
      const VecF dout = be.round(test::randn(NC, 162));
      VecF out(NC), rstd(s.N);
      be.cpu->rmsnorm_forward(out.data(), rstd.data(), inp.data(), w.data(), s.N, s.C, s.eps);
      // += outputs start from random values on both sides.
      VecF dinp = be.round(test::randn(NC, 163, 0.1f));
      VecF dw = be.round(test::randn(s.C, 164, 0.1f));
      Buffer d_inp = be.compute(inp), d_w = be.compute(w), d_dout = be.compute(dout);
      Buffer d_rstd = be.f32(rstd);
      Buffer d_dinp = be.compute(dinp), d_dw = be.compute(dw);
      be.cpu->rmsnorm_backward(dinp.data(), dw.data(), dout.data(), inp.data(), w.data(),
                               rstd.data(), s.N, s.C);
      be.gpu->rmsnorm_backward(d_dinp.data(), d_dw.data(), d_dout.data(), d_inp.data(), d_w.data(),
                               d_rstd.as<float>(), s.N, s.C);
      EXPECT_TRUE(test::close(be.read_compute(d_dinp, NC), dinp, test::tolerance(dt)));
      EXPECT_TRUE(test::close(be.read_compute(d_dw, s.C), dw, test::tolerance(dt)));
    }
  }
}

// The same backward twice gives the same bits (the dweight sum has a fixed order).
TEST(CudaRmsNorm, BackwardIsDeterministic) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  Backends be(DType::kF32);
  const int64_t N = 4099;
  const int C = 96;
  const VecF inp = test::randn(N * C, 170), w = test::randn(C, 171), dout = test::randn(N * C, 172);
  VecF out(N * C), rstd(N);
  be.cpu->rmsnorm_forward(out.data(), rstd.data(), inp.data(), w.data(), N, C, 1e-5f);
  Buffer d_inp = be.compute(inp), d_w = be.compute(w), d_dout = be.compute(dout);
  Buffer d_rstd = be.f32(rstd);
  VecF first;
  for (int run = 0; run < 2; ++run) {
    Buffer d_dinp = be.compute(VecF(N * C, 0.0f)), d_dw = be.compute(VecF(C, 0.0f));
    be.gpu->rmsnorm_backward(d_dinp.data(), d_dw.data(), d_dout.data(), d_inp.data(), d_w.data(),
                             d_rstd.as<float>(), N, C);
    const VecF dw = be.read_compute(d_dw, C);
    if (run == 0) {
      first = dw;
    } else {
      EXPECT_EQ(dw, first);
    }
  }
}

}  // namespace
}  // namespace zerod
