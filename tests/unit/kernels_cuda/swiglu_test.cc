// SwiGLU of the CUDA backend against the CPU reference (metric and limits: cuda_test_util.h).
// Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "cuda_test_util.h"

namespace zerod {
namespace {

using test::Backends;
using test::VecF;

struct Shape {
  int64_t N;
  int I;
};
// I a multiple of every 16-byte pack (vectorised), and odd (element by element).
constexpr Shape kShapes[] = {{37, 48}, {300, 771}, {1024, 256}, {3, 1}};

TEST(CudaSwiGlu, ForwardAndBackwardMatchTheCpu) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  for (DType dt : test::kAllDtypes) {
    for (const Shape& s : kShapes) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " N=" + std::to_string(s.N) +
                   " I=" + std::to_string(s.I));
      Backends be(dt);
      const int64_t NI = s.N * s.I;
      const VecF gu = be.round(test::randn(2 * NI, 200, 3.0f));
      const VecF dout = be.round(test::randn(NI, 201));
      VecF out(NI), dgu(2 * NI);
      be.cpu->swiglu_forward(out.data(), gu.data(), s.N, s.I);
      be.cpu->swiglu_backward(dgu.data(), dout.data(), gu.data(), s.N, s.I);
      Buffer d_gu = be.compute(gu), d_dout = be.compute(dout);
      Buffer d_out = be.poisoned_compute(NI), d_dgu = be.poisoned_compute(2 * NI);
      be.gpu->swiglu_forward(d_out.data(), d_gu.data(), s.N, s.I);
      be.gpu->swiglu_backward(d_dgu.data(), d_dout.data(), d_gu.data(), s.N, s.I);
      EXPECT_TRUE(test::close(be.read_compute(d_out, NI), out, test::tolerance(dt)));
      EXPECT_TRUE(test::close(be.read_compute(d_dgu, 2 * NI), dgu, test::tolerance(dt)));
      // In place: dgu written over gu.
      be.gpu->swiglu_backward(d_gu.data(), d_dout.data(), d_gu.data(), s.N, s.I);
      EXPECT_TRUE(test::close(be.read_compute(d_gu, 2 * NI), dgu, test::tolerance(dt)));
    }
  }
}

// Tensors that are not 16-byte aligned (element by element): from the second row's gate on, one
// row fewer.
TEST(CudaSwiGlu, UnalignedTensorsMatchTheCpu) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  for (DType dt : test::kAllDtypes) {
    SCOPED_TRACE(dtype_name(dt));
    Backends be(dt);
    const int64_t N = 20;
    const int I = 64;
    const VecF gu = be.round(test::randn(2 * N * I + 1, 210, 2.0f));
    const VecF dout = be.round(test::randn(N * I + 1, 211));
    VecF out(N * I), dgu(2 * N * I);
    be.cpu->swiglu_forward(out.data(), gu.data() + 1, N, I);
    be.cpu->swiglu_backward(dgu.data(), dout.data() + 1, gu.data() + 1, N, I);
    Buffer d_gu = be.compute(gu), d_dout = be.compute(dout);
    Buffer d_out = be.poisoned_compute(N * I + 1), d_dgu = be.poisoned_compute(2 * N * I + 1);
    const size_t e = be.gpu->compute_elem_size();
    auto shift = [e](Buffer& b) { return static_cast<char*>(b.data()) + e; };
    be.gpu->swiglu_forward(shift(d_out), shift(d_gu), N, I);
    be.gpu->swiglu_backward(shift(d_dgu), shift(d_dout), shift(d_gu), N, I);
    const VecF got_out = be.read_compute(d_out, N * I + 1);
    const VecF got_dgu = be.read_compute(d_dgu, 2 * N * I + 1);
    EXPECT_TRUE(std::isnan(got_out[0])) << "element 0 written";
    EXPECT_TRUE(test::close(VecF(got_out.begin() + 1, got_out.end()), out, test::tolerance(dt)));
    EXPECT_TRUE(test::close(VecF(got_dgu.begin() + 1, got_dgu.end()), dgu, test::tolerance(dt)));
  }
}

}  // namespace
}  // namespace zerod
