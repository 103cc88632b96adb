// The bias gradient's column sums (kernels/cuda/bias.h) through the CUDA backend's
// matmul_backward (dweight null: only dinp and dbias), with the column-per-thread kernel and the
// vector kernel (ZEROD_BIAS_GRAD_VECTOR): each against the CPU reference, the two against each
// other, the vector kernel bit for bit the same on a second run, and its fallbacks (OC not a
// multiple of the vector width, dout not 16-byte aligned). Skips without a GPU.
#include <gtest/gtest.h>

#include <string>

#include "kernels/cuda/bias.h"

#include "cuda_test_util.h"

namespace zerod {
namespace {

using test::Backends;
using test::VecF;

struct Shape {
  int64_t N;
  int OC;
};
// One row, a ragged chunk, model widths (GPT-2's qkv and MLP) and a width no vector divides.
constexpr Shape kShapes[] = {{1, 8}, {37, 96}, {1000, 768}, {4096, 2304}, {517, 3072}, {33, 70}};
constexpr int kC = 8;  // the input width (dinp), small: only dbias is under test

// db (OC) after matmul_backward on the GPU with the vector kernel on or off; dout at element
// offset `skew` of its buffer (1: 2- or 4-byte aligned, the fallback).
VecF gpu_dbias(Backends& be, const VecF& dout_buf, int skew, const VecF& db0, const Shape& s,
               bool vector) {
  cuda::set_bias_grad_vector(vector);
  const VecF inp = be.round(test::randn(s.N * kC, 90));
  const VecF w = be.round(test::randn(int64_t{s.OC} * kC, 91, 0.2f));
  Buffer d_inp = be.compute(inp), d_w = be.compute(w), d_dout = be.compute(dout_buf);
  Buffer d_dinp = be.poisoned_compute(s.N * kC), d_db = be.compute(db0);
  const void* dout = static_cast<const char*>(d_dout.data()) + skew * be.gpu->compute_elem_size();
  be.gpu->matmul_backward(d_dinp.data(), nullptr, d_db.data(), dout, d_inp.data(), d_w.data(), s.N,
                          kC, s.OC, false);
  VecF out = be.read_compute(d_db, s.OC);
  cuda::set_bias_grad_vector(false);
  return out;
}

TEST(CudaBias, VectorAndColumnKernelsSumTheColumnsLikeTheCpu) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  for (DType dt : test::kAllDtypes) {
    for (const Shape& s : kShapes) {
      for (int skew : {0, 1}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " N=" + std::to_string(s.N) +
                     " OC=" + std::to_string(s.OC) + " skew " + std::to_string(skew));
        Backends be(dt);
        const int64_t n = s.N * s.OC;
        const VecF dout_buf = be.round(test::randn(n + skew, 92));
        const VecF db0 = be.round(test::randn(s.OC, 93, 0.5f));
        // The CPU's dbias += column sums (dinp and dweight aside).
        VecF want = db0;
        for (int64_t r = 0; r < s.N; ++r)
          for (int c = 0; c < s.OC; ++c)
            want[static_cast<size_t>(c)] += dout_buf[static_cast<size_t>(skew + r * s.OC + c)];
        want = be.round(want);
        const VecF columns = gpu_dbias(be, dout_buf, skew, db0, s, false);
        const VecF vector = gpu_dbias(be, dout_buf, skew, db0, s, true);
        const VecF again = gpu_dbias(be, dout_buf, skew, db0, s, true);
        EXPECT_TRUE(test::close(columns, want, test::tolerance(dt)));
        EXPECT_TRUE(test::close(vector, want, test::tolerance(dt)));
        EXPECT_TRUE(test::close(vector, columns, test::tolerance(dt)));
        EXPECT_EQ(vector, again);  // deterministic: fixed chunks, lanes and combine order
      }
    }
  }
}

TEST(CudaBias, TheVectorSwitchIsOffByDefaultAndSettable) {
  EXPECT_FALSE(cuda::bias_grad_vector());
  cuda::set_bias_grad_vector(true);
  EXPECT_TRUE(cuda::bias_grad_vector());
  cuda::set_bias_grad_vector(false);
  EXPECT_FALSE(cuda::bias_grad_vector());
}

}  // namespace
}  // namespace zerod
