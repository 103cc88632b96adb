// Token + position embedding of the CUDA backend against the CPU reference (metric and limits:
// cuda_test_util.h). Skips without a GPU.
#include <gtest/gtest.h>

#include <limits>
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
    be.cpu->encoder_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C, nullptr);
    Buffer d_tok = be.i32(tok), d_wte = be.compute(wte), d_wpe = be.compute(wpe);
    Buffer d_out = be.poisoned_compute(static_cast<int64_t>(out.size()));
    be.gpu->encoder_forward(d_out.data(), d_tok.as<int32_t>(), d_wte.data(), d_wpe.data(), B, T, C,
                            nullptr);
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
    be.cpu->encoder_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), B, T, C, nullptr);
    be.gpu->encoder_backward(d_dwte.data(), d_dwpe.data(), d_dout.data(), d_tok.as<int32_t>(), B, T,
                             C, nullptr);
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
    be.cpu->encoder_forward(out.data(), tok.data(), wte.data(), nullptr, B, T, C, nullptr);
    Buffer d_tok = be.i32(tok), d_wte = be.compute(wte);
    Buffer d_out = be.poisoned_compute(static_cast<int64_t>(out.size()));
    be.gpu->encoder_forward(d_out.data(), d_tok.as<int32_t>(), d_wte.data(), nullptr, B, T, C,
                            nullptr);
    // The token rows, copied: exact.
    EXPECT_TRUE(test::close(be.read_compute(d_out, static_cast<int64_t>(out.size())), out, 0.0));

    const VecF dout = be.round(test::randn(int64_t{B} * T * C, 123));
    VecF dwte = be.round(test::randn(int64_t{Vp} * C, 124, 0.1f));
    Buffer d_dout = be.compute(dout), d_dwte = be.compute(dwte);
    be.cpu->encoder_backward(dwte.data(), nullptr, dout.data(), tok.data(), B, T, C, nullptr);
    be.gpu->encoder_backward(d_dwte.data(), nullptr, d_dout.data(), d_tok.as<int32_t>(), B, T, C,
                             nullptr);
    EXPECT_TRUE(test::close(be.read_compute(d_dwte, static_cast<int64_t>(dwte.size())), dwte,
                            test::tolerance(dt)));
  }
}

// A vocabulary-parallel shard: tokens < 0 (not held here) get wpe only and no wte gradient.
// Negative tokens sort first in the backward's radix sort; their runs must be skipped without
// touching memory before dwte.
TEST(CudaEncoder, NegativeTokensMatchTheCpu) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  VecI tok = tokens();
  for (int i = 0; i < B * T; i += 4) tok[i] = -1;
  tok[1] = -1000;
  tok[B * T - 2] = std::numeric_limits<int32_t>::min();
  for (DType dt : test::kAllDtypes) {
    SCOPED_TRACE(dtype_name(dt));
    Backends be(dt);
    const VecF wte = be.round(test::randn(int64_t{Vp} * C, 131));
    const VecF wpe = be.round(test::randn(int64_t{kWpeRows} * C, 132));
    const int64_t n_out = int64_t{B} * T * C;
    Buffer d_tok = be.i32(tok), d_wte = be.compute(wte), d_wpe = be.compute(wpe);
    // Forward with and without position embedding.
    for (bool pos : {true, false}) {
      SCOPED_TRACE(pos ? "wpe" : "no wpe");
      VecF out(n_out);
      be.cpu->encoder_forward(out.data(), tok.data(), wte.data(), pos ? wpe.data() : nullptr, B, T,
                              C, nullptr);
      Buffer d_out = be.poisoned_compute(n_out);
      be.gpu->encoder_forward(d_out.data(), d_tok.as<int32_t>(), d_wte.data(),
                              pos ? d_wpe.data() : nullptr, B, T, C, nullptr);
      const VecF got = be.read_compute(d_out, n_out);
      EXPECT_TRUE(test::close(got, out, test::tolerance(dt)));
      for (int r = 0; r < B * T; ++r) {
        if (tok[r] >= 0) continue;
        for (int c = 0; c < C; ++c) {
          ASSERT_EQ(got[r * C + c], pos ? wpe[(r % T) * C + c] : 0.0f) << "row " << r;
        }
      }
    }
    // Backward: dwte rows of unused tokens stay exactly as they were; dwpe gets every row.
    const VecF dout = be.round(test::randn(n_out, 133));
    const VecF dwte0 = be.round(test::randn(int64_t{Vp} * C, 134, 0.1f));
    VecF dwte = dwte0, dwpe = be.round(test::randn(int64_t{T} * C, 135, 0.1f));
    Buffer d_dout = be.compute(dout), d_dwte = be.compute(dwte), d_dwpe = be.compute(dwpe);
    be.cpu->encoder_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), B, T, C, nullptr);
    be.gpu->encoder_backward(d_dwte.data(), d_dwpe.data(), d_dout.data(), d_tok.as<int32_t>(), B, T,
                             C, nullptr);
    const VecF got_dwte = be.read_compute(d_dwte, static_cast<int64_t>(dwte.size()));
    EXPECT_TRUE(test::close(got_dwte, dwte, test::tolerance(dt)));
    EXPECT_TRUE(test::close(be.read_compute(d_dwpe, static_cast<int64_t>(dwpe.size())), dwpe,
                            test::tolerance(dt)));
    for (int v = 10; v < Vp - 1; ++v)  // ids 10 .. Vp-2 never occur
      for (int c = 0; c < C; ++c) ASSERT_EQ(got_dwte[v * C + c], dwte0[v * C + c]) << v;
  }
}

// Document masking: positions t - doc_start[b,t] (several documents per row, one of a single
// position, a row of one document) forward, and the dwpe sums of the backward's document walk.
TEST(CudaEncoder, DocumentMaskingMatchesTheCpu) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  VecI ds(static_cast<size_t>(B) * T, 0);
  const std::vector<std::vector<int>> starts = {{4, 5, 11}, {}, {1, 2, 3, 9, 16}};
  for (int b = 0; b < B; ++b) {
    int cur = 0;
    for (int t = 0; t < T; ++t) {
      for (int x : starts[static_cast<size_t>(b)])
        if (x == t) cur = t;
      ds[static_cast<size_t>(b) * T + t] = cur;
    }
  }
  for (DType dt : test::kAllDtypes) {
    SCOPED_TRACE(dtype_name(dt));
    Backends be(dt);
    const VecI tok = tokens();
    const VecF wte = be.round(test::randn(int64_t{Vp} * C, 141));
    const VecF wpe = be.round(test::randn(int64_t{kWpeRows} * C, 142));
    const int64_t n_out = int64_t{B} * T * C;
    Buffer d_tok = be.i32(tok), d_ds = be.i32(ds), d_wte = be.compute(wte), d_wpe = be.compute(wpe);
    VecF out(n_out);
    be.cpu->encoder_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C, ds.data());
    Buffer d_out = be.poisoned_compute(n_out);
    be.gpu->encoder_forward(d_out.data(), d_tok.as<int32_t>(), d_wte.data(), d_wpe.data(), B, T, C,
                            d_ds.as<int32_t>());
    EXPECT_TRUE(test::close(be.read_compute(d_out, n_out), out, test::tolerance(dt)));
    const VecF dout = be.round(test::randn(n_out, 143));
    VecF dwte = be.round(test::randn(int64_t{Vp} * C, 144, 0.1f));
    VecF dwpe = be.round(test::randn(int64_t{T} * C, 145, 0.1f));
    Buffer d_dout = be.compute(dout), d_dwte = be.compute(dwte), d_dwpe = be.compute(dwpe);
    be.cpu->encoder_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), B, T, C, ds.data());
    be.gpu->encoder_backward(d_dwte.data(), d_dwpe.data(), d_dout.data(), d_tok.as<int32_t>(), B, T,
                             C, d_ds.as<int32_t>());
    EXPECT_TRUE(test::close(be.read_compute(d_dwte, static_cast<int64_t>(dwte.size())), dwte,
                            test::tolerance(dt)));
    EXPECT_TRUE(test::close(be.read_compute(d_dwpe, static_cast<int64_t>(dwpe.size())), dwpe,
                            test::tolerance(dt)));
  }
}

}  // namespace
}  // namespace zerod
