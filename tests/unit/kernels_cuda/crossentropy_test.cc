// Softmax cross-entropy of the CUDA backend against the CPU reference (metric and limits:
// cuda_test_util.h). Skips without a GPU.
#include <gtest/gtest.h>

#include <string>

#include "cuda_test_util.h"

namespace zerod {
namespace {

using test::Backends;
using test::VecF;
using test::VecI;

constexpr int64_t N = 23;
constexpr int V = 1000, Vp = 1024;

// Targets in [0, V) with a few positions without loss (-1), one at each end of the vocabulary.
VecI targets() {
  VecI t = test::randi(N, 130, 0, V);
  t[0] = V - 1;
  t[1] = 0;
  t[4] = -1;
  t[N - 1] = -1;
  return t;
}

TEST(CudaCrossEntropy, ForwardMatchesTheCpu) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  for (DType dt : test::kAllDtypes) {
    SCOPED_TRACE(dtype_name(dt));
    Backends be(dt);
    const VecI tgt = targets();
    const VecF logits = be.round(test::randn(N * Vp, 131, 2.0f));  // padding too: it is ignored
    VecF losses(N);
    be.cpu->crossentropy_forward(losses.data(), logits.data(), tgt.data(), N, V, Vp);
    Buffer d_logits = be.compute(logits), d_tgt = be.i32(tgt), d_losses = be.poisoned_f32(N);
    be.gpu->crossentropy_forward(d_losses.as<float>(), d_logits.data(), d_tgt.as<int32_t>(), N, V,
                                 Vp);
    // Losses are fp32 on both sides, from identical logits.
    EXPECT_TRUE(test::close(be.read_f32(d_losses, N), losses, 1e-5));
  }
}

TEST(CudaCrossEntropy, FusedMatchesTheCpuAndZeroesThePadding) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  for (DType dt : test::kAllDtypes) {
    SCOPED_TRACE(dtype_name(dt));
    Backends be(dt);
    const VecI tgt = targets();
    VecF logits = be.round(test::randn(N * Vp, 140, 2.0f));
    const float dloss = 1.0f / static_cast<float>(N);
    Buffer d_logits = be.compute(logits), d_tgt = be.i32(tgt), d_losses = be.poisoned_f32(N);
    VecF losses(N);
    be.cpu->crossentropy_fused(losses.data(), logits.data(), tgt.data(), N, V, Vp, dloss);
    be.gpu->crossentropy_fused(d_losses.as<float>(), d_logits.data(), d_tgt.as<int32_t>(), N, V, Vp,
                               dloss);
    EXPECT_TRUE(test::close(be.read_f32(d_losses, N), losses, 1e-5));
    const VecF dlogits = be.read_compute(d_logits, N * Vp);
    EXPECT_TRUE(test::close(dlogits, logits, test::tolerance(dt)));
    for (int64_t n = 0; n < N; ++n) {
      for (int j = V; j < Vp; ++j) ASSERT_EQ(dlogits[n * Vp + j], 0.0f) << n << " " << j;
    }
  }
}

}  // namespace
}  // namespace zerod
