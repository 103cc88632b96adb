// Token + position embedding of the CUDA backend against the CPU reference (metric and limits:
// cuda_test_util.h). Skips without a GPU.
#include <gtest/gtest.h>

#include <string>

#include "cuda_test_util.h"

namespace zerod {
namespace {

using test::Backends;
using test::VecF;
using test::VecI;

constexpr int B = 3, T = 17, C = 40, Vp = 64, kWpeRows = T + 3;

// Tokens with many repeats (ids 0..9) and the last id of the padded vocabulary.
VecI tokens() {
  VecI t = test::randi(int64_t{B} * T, 110, 0, 10);
  t[5] = Vp - 1;
  t[B * T - 1] = Vp - 1;
  return t;
}

TEST(CudaEncoder, ForwardMatchesTheCpu) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  for (DType dt : test::kAllDtypes) {
    SCOPED_TRACE(dtype_name(dt));
    Backends be(dt);
    const VecI tok = tokens();
    const VecF wte = be.round(test::randn(int64_t{Vp} * C, 111));
    const VecF wpe = be.round(test::randn(int64_t{kWpeRows} * C, 112));
    VecF out(int64_t{B} * T * C);
    be.cpu->encoder_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
    Buffer d_tok = be.i32(tok), d_wte = be.compute(wte), d_wpe = be.compute(wpe);
    Buffer d_out = be.poisoned_compute(static_cast<int64_t>(out.size()));
    be.gpu->encoder_forward(d_out.data(), d_tok.as<int32_t>(), d_wte.data(), d_wpe.data(), B, T, C);
    EXPECT_TRUE(test::close(be.read_compute(d_out, static_cast<int64_t>(out.size())), out,
                            test::tolerance(dt)));
  }
}

TEST(CudaEncoder, BackwardAccumulatesLikeTheCpu) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  for (DType dt : test::kAllDtypes) {
    SCOPED_TRACE(dtype_name(dt));
    Backends be(dt);
    const VecI tok = tokens();
    const VecF dout = be.round(test::randn(int64_t{B} * T * C, 120));
    // += outputs start from random values on both sides.
    VecF dwte = be.round(test::randn(int64_t{Vp} * C, 121, 0.1f));
    VecF dwpe = be.round(test::randn(int64_t{T} * C, 122, 0.1f));
    Buffer d_tok = be.i32(tok), d_dout = be.compute(dout);
    Buffer d_dwte = be.compute(dwte), d_dwpe = be.compute(dwpe);
    be.cpu->encoder_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), B, T, C);
    be.gpu->encoder_backward(d_dwte.data(), d_dwpe.data(), d_dout.data(), d_tok.as<int32_t>(), B, T,
                             C);
    EXPECT_TRUE(test::close(be.read_compute(d_dwte, static_cast<int64_t>(dwte.size())), dwte,
                            test::tolerance(dt)));
    EXPECT_TRUE(test::close(be.read_compute(d_dwpe, static_cast<int64_t>(dwpe.size())), dwpe,
                            test::tolerance(dt)));
  }
}

// Models without learned positions: wpe and dwpe null (out = wte[tokens]; dwte only).
TEST(CudaEncoder, WithoutPositionEmbeddingMatchesTheCpu) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  for (DType dt : test::kAllDtypes) {
    SCOPED_TRACE(dtype_name(dt));
    Backends be(dt);
    const VecI tok = tokens();
    const VecF wte = be.round(test::randn(int64_t{Vp} * C, 113));
    VecF out(int64_t{B} * T * C);
    be.cpu->encoder_forward(out.data(), tok.data(), wte.data(), nullptr, B, T, C);
    Buffer d_tok = be.i32(tok), d_wte = be.compute(wte);
    Buffer d_out = be.poisoned_compute(static_cast<int64_t>(out.size()));
    be.gpu->encoder_forward(d_out.data(), d_tok.as<int32_t>(), d_wte.data(), nullptr, B, T, C);
    // The token rows, copied: exact.
    EXPECT_TRUE(test::close(be.read_compute(d_out, static_cast<int64_t>(out.size())), out, 0.0));

    const VecF dout = be.round(test::randn(int64_t{B} * T * C, 123));
    VecF dwte = be.round(test::randn(int64_t{Vp} * C, 124, 0.1f));
    Buffer d_dout = be.compute(dout), d_dwte = be.compute(dwte);
    be.cpu->encoder_backward(dwte.data(), nullptr, dout.data(), tok.data(), B, T, C);
    be.gpu->encoder_backward(d_dwte.data(), nullptr, d_dout.data(), d_tok.as<int32_t>(), B, T, C);
    EXPECT_TRUE(test::close(be.read_compute(d_dwte, static_cast<int64_t>(dwte.size())), dwte,
                            test::tolerance(dt)));
  }
}

}  // namespace
}  // namespace zerod
