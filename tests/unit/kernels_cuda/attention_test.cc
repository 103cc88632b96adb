// Fused causal attention of the CUDA backend against the CPU reference (metric and limits:
// cuda_test_util.h), through both implementations: the tensor-core kernels (bf16/fp16, head
// sizes 32/64/128) and the SIMT ones; multi-head, grouped-query (NH/KVH query heads per key/value
// head) and sliding-window shapes; and generation with a KV cache. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "core/error.h"
#include "cuda_test_util.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_mma.h"

namespace zerod {
namespace {

using test::Backends;
using test::VecF;

struct Shape {
  int B, T, NH, KVH, HS, window;
};
// MHA: head sizes 16, 64, 80 and 256 (1, 2, 4 (partly used) and 8 channels per lane for the SIMT
// kernels, the last past 48 KiB of shared memory); T not a multiple of the 32-row tiles, and a
// single position. For the tensor-core kernels (64-row tiles): head sizes 32, 64 and 128, T
// across several tiles and not a multiple of 64.
// GQA: 2 and 4 query heads per key/value head (KVH 2 and 1), tensor-core and SIMT head sizes.
// Windows: not a multiple of either tile (so that whole key tiles and 16-wide sub-tiles are
// skipped and partial ones masked), equal to a tile, 2 (a position and its predecessor; with 1
// dQ and dK vanish and both sides hold only rounding noise), wider than T (no effect), and with
// GQA.
constexpr Shape kShapes[] = {
    // MHA, causal
    {2, 67, 3, 3, 16, 0},
    {2, 100, 2, 2, 64, 0},
    {1, 45, 2, 2, 80, 0},
    {1, 40, 1, 1, 256, 0},
    {3, 1, 4, 4, 16, 0},
    {2, 130, 3, 3, 32, 0},
    {1, 193, 2, 2, 128, 0},
    {1, 64, 4, 4, 32, 0},
    {2, 7, 3, 3, 128, 0},
    {1, 1, 2, 2, 64, 0},
    {2, 256, 3, 3, 64, 0},
    // GQA, causal
    {2, 130, 4, 2, 64, 0},
    {1, 100, 4, 1, 32, 0},
    {2, 67, 4, 1, 16, 0},
    {1, 193, 4, 2, 128, 0},
    {1, 45, 4, 2, 80, 0},
    {1, 300, 2, 1, 64, 0},
    // sliding window
    {1, 200, 2, 2, 64, 50},
    {2, 150, 4, 2, 32, 17},
    {1, 130, 4, 1, 80, 33},
    {1, 70, 2, 1, 64, 2},
    {1, 190, 3, 3, 128, 64},
    {1, 100, 2, 2, 16, 32},
    {1, 40, 2, 2, 64, 100},
};

AttentionShape attention_shape(const Shape& s) {
  AttentionShape a;
  a.B = s.B;
  a.T = s.T;
  a.NH = s.NH;
  a.KVH = s.KVH;
  a.HS = s.HS;
  a.window = s.window;
  return a;
}

const char* impl_name(cuda::AttentionImpl impl) {
  switch (impl) {
    case cuda::AttentionImpl::kSimt:
      return " simt";
    case cuda::AttentionImpl::kWmma:
      return " wmma";
    case cuda::AttentionImpl::kAuto:
      break;
  }
  return " auto";
}

std::string label(DType dt, const Shape& s) {
  return std::string(dtype_name(dt)) + " B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
         " NH=" + std::to_string(s.NH) + " KVH=" + std::to_string(s.KVH) +
         " HS=" + std::to_string(s.HS) + " window=" + std::to_string(s.window) +
         impl_name(cuda::attention_impl());
}

// Runs the test body under each implementation, restoring the automatic choice after.
class CudaAttention : public ::testing::TestWithParam<cuda::AttentionImpl> {
 protected:
  void SetUp() override { cuda::set_attention_impl(GetParam()); }
  void TearDown() override { cuda::set_attention_impl(cuda::AttentionImpl::kAuto); }
};

TEST_P(CudaAttention, ForwardMatchesTheCpuOutputAndLse) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  for (DType dt : test::kAllDtypes) {
    for (const Shape& sh : kShapes) {
      SCOPED_TRACE(label(dt, sh));
      const AttentionShape s = attention_shape(sh);
      Backends be(dt);
      const int64_t BT = int64_t{s.B} * s.T;
      const VecF qkv = be.round(test::randn(BT * s.qkv_row(), 90, 1.5f));
      VecF out(BT * s.out_row()), lse(int64_t{s.B} * s.NH * s.T);
      be.cpu->attention_forward(out.data(), lse.data(), qkv.data(), s);
      Buffer d_qkv = be.compute(qkv);
      Buffer d_out = be.poisoned_compute(BT * s.out_row());
      Buffer d_lse = be.poisoned_f32(static_cast<int64_t>(lse.size()));
      be.gpu->attention_forward(d_out.data(), d_lse.as<float>(), d_qkv.data(), s);
      EXPECT_TRUE(test::close(be.read_compute(d_out, BT * s.out_row()), out, test::tolerance(dt)));
      // lse is fp32 on both sides, from identical inputs.
      EXPECT_TRUE(test::close(be.read_f32(d_lse, static_cast<int64_t>(lse.size())), lse, 1e-5));
    }
  }
}

TEST_P(CudaAttention, BackwardMatchesTheCpu) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  for (DType dt : test::kAllDtypes) {
    for (const Shape& sh : kShapes) {
      SCOPED_TRACE(label(dt, sh));
      const AttentionShape s = attention_shape(sh);
      Backends be(dt);
      const int64_t BT = int64_t{s.B} * s.T;
      const VecF qkv = be.round(test::randn(BT * s.qkv_row(), 100, 1.5f));
      const VecF dout = be.round(test::randn(BT * s.out_row(), 101));
      VecF out(BT * s.out_row()), lse(int64_t{s.B} * s.NH * s.T);
      be.cpu->attention_forward(out.data(), lse.data(), qkv.data(), s);
      out = be.round(out);  // the stored forward output both backward passes read
      VecF dqkv(BT * s.qkv_row());
      be.cpu->attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s);
      Buffer d_qkv = be.compute(qkv), d_dout = be.compute(dout), d_out = be.compute(out);
      Buffer d_lse = be.f32(lse);
      // Poisoned: every q, k and v channel of every row must be written.
      Buffer d_dqkv = be.poisoned_compute(BT * s.qkv_row());
      be.gpu->attention_backward(d_dqkv.data(), d_dout.data(), d_qkv.data(), d_out.data(),
                                 d_lse.as<float>(), s);
      EXPECT_TRUE(
          test::close(be.read_compute(d_dqkv, BT * s.qkv_row()), dqkv, test::tolerance(dt)));
    }
  }
}

// Document masking (AttentionShape::doc_start): every implementation choice runs the SIMT
// kernels for it. Documents of 1 to 70 positions, a different split per row, across 32-row tiles,
// with and without a window, MHA and GQA; forward and backward against the CPU.
TEST_P(CudaAttention, DocumentMaskingMatchesTheCpu) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  constexpr Shape kDocShapes[] = {
      {2, 67, 3, 3, 16, 0},   {2, 130, 4, 2, 64, 0},  {1, 193, 4, 2, 128, 0},
      {2, 150, 4, 2, 32, 17}, {1, 100, 2, 2, 16, 32}, {1, 45, 4, 2, 80, 0},
  };
  constexpr int kLengths[] = {1, 13, 40, 5, 70, 32, 2};
  for (DType dt : test::kAllDtypes) {
    for (const Shape& sh : kDocShapes) {
      SCOPED_TRACE(label(dt, sh) + " doc_start");
      test::VecI ds(static_cast<size_t>(sh.B) * sh.T);
      for (int b = 0; b < sh.B; ++b) {
        int start = 0, next = kLengths[b % 7], k = b;
        for (int t = 0; t < sh.T; ++t) {
          if (t == next) {
            start = t;
            next = t + kLengths[++k % 7];
          }
          ds[static_cast<size_t>(b) * sh.T + t] = start;
        }
      }
      Backends be(dt);
      AttentionShape s = attention_shape(sh);
      const int64_t BT = int64_t{s.B} * s.T;
      const VecF qkv = be.round(test::randn(BT * s.qkv_row(), 150, 1.5f));
      const VecF dout = be.round(test::randn(BT * s.out_row(), 151));
      VecF out(BT * s.out_row()), lse(int64_t{s.B} * s.NH * s.T), dqkv(BT * s.qkv_row());
      s.doc_start = ds.data();
      be.cpu->attention_forward(out.data(), lse.data(), qkv.data(), s);
      out = be.round(out);
      be.cpu->attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s);
      Buffer d_ds = be.i32(ds), d_qkv = be.compute(qkv), d_dout = be.compute(dout);
      s.doc_start = d_ds.as<int32_t>();
      Buffer d_out = be.poisoned_compute(BT * s.out_row());
      Buffer d_lse = be.poisoned_f32(static_cast<int64_t>(lse.size()));
      be.gpu->attention_forward(d_out.data(), d_lse.as<float>(), d_qkv.data(), s);
      EXPECT_TRUE(test::close(be.read_compute(d_out, BT * s.out_row()), out, test::tolerance(dt)));
      EXPECT_TRUE(test::close(be.read_f32(d_lse, static_cast<int64_t>(lse.size())), lse, 1e-5));
      Buffer d_out_cpu = be.compute(out), d_lse_cpu = be.f32(lse);
      Buffer d_dqkv = be.poisoned_compute(BT * s.qkv_row());
      be.gpu->attention_backward(d_dqkv.data(), d_dout.data(), d_qkv.data(), d_out_cpu.data(),
                                 d_lse_cpu.as<float>(), s);
      EXPECT_TRUE(
          test::close(be.read_compute(d_dqkv, BT * s.qkv_row()), dqkv, test::tolerance(dt)));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Impl, CudaAttention,
                         ::testing::Values(cuda::AttentionImpl::kAuto, cuda::AttentionImpl::kWmma,
                                           cuda::AttentionImpl::kSimt),
                         [](const auto& info) { return std::string(impl_name(info.param) + 1); });

// The mma kernels' variants (kernels/cuda/attention_mma.h: 64- or 128-row blocks, fragments held
// or reloaded, 32 or 64 columns a pass, register budgets) do the same arithmetic in the same
// order: every variant's out, lse and dqkv must equal variant 0's bit for bit (variant 0 is
// checked against the CPU above), on head-size-64 shapes with partial blocks of 64 and 128
// rows, GQA, and a single position. Outputs start poisoned (NaN never equals).
TEST(CudaAttentionMma, EveryVariantGivesBitwiseTheOutputsOfVariantZero) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  constexpr Shape kMmaShapes[] = {{2, 300, 4, 2, 64, 0}, {1, 129, 2, 2, 64, 0},
                                  {3, 64, 4, 4, 64, 0},  {1, 1, 2, 1, 64, 0},
                                  {1, 200, 8, 2, 64, 0}, {2, 128, 2, 2, 64, 0}};
  for (DType dt : {DType::kBF16, DType::kF16}) {
    for (const Shape& sh : kMmaShapes) {
      SCOPED_TRACE(label(dt, sh));
      const AttentionShape s = attention_shape(sh);
      Backends be(dt);
      const int64_t BT = int64_t{s.B} * s.T;
      const int64_t nlse = int64_t{s.B} * s.NH * s.T;
      Buffer d_qkv = be.compute(be.round(test::randn(BT * s.qkv_row(), 110, 1.5f)));
      Buffer d_dout = be.compute(be.round(test::randn(BT * s.out_row(), 111)));
      VecF out0, lse0, dqkv0;
      auto run = [&](cuda::MmaVariants v, VecF& out, VecF& lse, VecF& dqkv) {
        cuda::set_attention_mma_variants(v);
        Buffer d_out = be.poisoned_compute(BT * s.out_row());
        Buffer d_lse = be.poisoned_f32(nlse);
        be.gpu->attention_forward(d_out.data(), d_lse.as<float>(), d_qkv.data(), s);
        Buffer d_dqkv = be.poisoned_compute(BT * s.qkv_row());
        be.gpu->attention_backward(d_dqkv.data(), d_dout.data(), d_qkv.data(), d_out.data(),
                                   d_lse.as<float>(), s);
        out = be.read_compute(d_out, BT * s.out_row());
        lse = be.read_f32(d_lse, nlse);
        dqkv = be.read_compute(d_dqkv, BT * s.qkv_row());
      };
      run({0, 0, 0}, out0, lse0, dqkv0);
      const int most =
          std::max({cuda::kMmaForwardVariants, cuda::kMmaDqVariants, cuda::kMmaDkdvVariants});
      for (int i = 1; i < most; ++i) {
        const cuda::MmaVariants v{std::min(i, cuda::kMmaForwardVariants - 1),
                                  std::min(i, cuda::kMmaDqVariants - 1),
                                  std::min(i, cuda::kMmaDkdvVariants - 1)};
        SCOPED_TRACE("variants " + std::to_string(v.forward) + "," + std::to_string(v.dq) + "," +
                     std::to_string(v.dkdv));
        VecF out, lse, dqkv;
        run(v, out, lse, dqkv);
        EXPECT_TRUE(out == out0);
        EXPECT_TRUE(lse == lse0);
        EXPECT_TRUE(dqkv == dqkv0);
      }
      cuda::set_attention_mma_variants({});
    }
  }
}

// Out-of-range variant numbers are refused as bad input (exit code 2), and ZEROD_ATTENTION_MMA's
// values are parsed or refused naming the variable (no GPU needed).
TEST(CudaAttentionMma, AVariantThatDoesNotExistIsRefused) {
  const cuda::MmaVariants before = cuda::attention_mma_variants();
  EXPECT_THROW(cuda::set_attention_mma_variants({cuda::kMmaForwardVariants, 0, 0}), InputError);
  EXPECT_THROW(cuda::set_attention_mma_variants({0, -1, 0}), InputError);
  EXPECT_THROW(cuda::set_attention_mma_variants({0, 0, cuda::kMmaDkdvVariants}), InputError);
  const cuda::MmaVariants parsed = cuda::parse_attention_mma_variants("2,4,1");
  EXPECT_EQ(parsed.forward, 2);
  EXPECT_EQ(parsed.dq, 4);
  EXPECT_EQ(parsed.dkdv, 1);
  for (const char* bad : {"", "1,3", "1,3,3,", "1,3,x", "9,0,0", "0,0,-1", "a"}) {
    try {
      cuda::parse_attention_mma_variants(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("ZEROD_ATTENTION_MMA"), std::string::npos) << e.what();
    }
  }
  const cuda::MmaVariants after = cuda::attention_mma_variants();
  EXPECT_EQ(after.forward, before.forward);
  EXPECT_EQ(after.dq, before.dq);
  EXPECT_EQ(after.dkdv, before.dkdv);
}

// Generation: a prefix of pos0 positions goes through the cache first (a prefill call at 0),
// then Tq new positions at pos0; out and the caches against the CPU's same two calls, and out
// against the CPU's attention_forward over the whole sequence (the contract: the same
// computation). The GPU caches start poisoned: a read of a position not yet written gives NaN.
struct CacheShape {
  int B, NH, KVH, HS, window, pos0, Tq, maxT;
};
constexpr CacheShape kCacheShapes[] = {
    {2, 4, 2, 64, 0, 37, 1, 64},     // GQA decode step over two 32-key chunks
    {1, 4, 1, 32, 16, 50, 5, 80},    // window, several new positions
    {2, 3, 3, 80, 0, 0, 9, 9},       // a prefill only, filling the cache
    {1, 2, 1, 256, 7, 100, 3, 128},  // largest head size, a narrow window
    {1, 2, 2, 16, 0, 70, 1, 71},     // MHA, three key chunks, the last cache position
};

TEST(CudaAttentionKvCache, MatchesTheCpuAndTheFullForward) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  for (DType dt : test::kAllDtypes) {
    for (const CacheShape& c : kCacheShapes) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " B=" + std::to_string(c.B) +
                   " NH=" + std::to_string(c.NH) + " KVH=" + std::to_string(c.KVH) +
                   " HS=" + std::to_string(c.HS) + " window=" + std::to_string(c.window) +
                   " pos0=" + std::to_string(c.pos0) + " Tq=" + std::to_string(c.Tq));
      Backends be(dt);
      const int L = c.pos0 + c.Tq;  // the whole sequence
      AttentionShape full;
      full.B = c.B;
      full.T = L;
      full.NH = c.NH;
      full.KVH = c.KVH;
      full.HS = c.HS;
      full.window = c.window;
      const int64_t R = full.qkv_row(), O = full.out_row();
      const int64_t kv_row = int64_t{c.KVH} * c.HS;
      const VecF qkv = be.round(test::randn(int64_t{c.B} * L * R, 130, 1.5f));
      // The prefix rows [0, pos0) and the new rows [pos0, L) of each batch entry.
      VecF pre(int64_t{c.B} * c.pos0 * R), cur(int64_t{c.B} * c.Tq * R);
      for (int b = 0; b < c.B; ++b) {
        const float* src = qkv.data() + int64_t{b} * L * R;
        std::copy(src, src + int64_t{c.pos0} * R, pre.begin() + int64_t{b} * c.pos0 * R);
        std::copy(src + int64_t{c.pos0} * R, src + int64_t{L} * R,
                  cur.begin() + int64_t{b} * c.Tq * R);
      }
      AttentionShape s_pre = full, s_cur = full;
      s_pre.T = c.pos0;
      s_cur.T = c.Tq;
      const int64_t cache_n = int64_t{c.B} * c.maxT * kv_row;

      VecF kc(cache_n, 0.0f), vc(cache_n, 0.0f);
      VecF out_pre(int64_t{c.B} * c.pos0 * O), out(int64_t{c.B} * c.Tq * O);
      if (c.pos0 > 0) {
        be.cpu->attention_kv_cache(out_pre.data(), pre.data(), kc.data(), vc.data(), 0, c.maxT,
                                   s_pre);
      }
      be.cpu->attention_kv_cache(out.data(), cur.data(), kc.data(), vc.data(), c.pos0, c.maxT,
                                 s_cur);

      Buffer d_kc = be.poisoned_compute(cache_n), d_vc = be.poisoned_compute(cache_n);
      Buffer d_pre = be.compute(pre.empty() ? VecF(1) : pre), d_cur = be.compute(cur);
      Buffer d_out_pre = be.poisoned_compute(std::max<int64_t>(1, out_pre.size()));
      Buffer d_out = be.poisoned_compute(static_cast<int64_t>(out.size()));
      if (c.pos0 > 0) {
        be.gpu->attention_kv_cache(d_out_pre.data(), d_pre.data(), d_kc.data(), d_vc.data(), 0,
                                   c.maxT, s_pre);
        EXPECT_TRUE(test::close(be.read_compute(d_out_pre, static_cast<int64_t>(out_pre.size())),
                                out_pre, test::tolerance(dt)));
      }
      be.gpu->attention_kv_cache(d_out.data(), d_cur.data(), d_kc.data(), d_vc.data(), c.pos0,
                                 c.maxT, s_cur);
      EXPECT_TRUE(test::close(be.read_compute(d_out, static_cast<int64_t>(out.size())), out,
                              test::tolerance(dt)));

      // The written cache positions [0, L) are copies of k and v (exact).
      const VecF got_k = be.read_compute(d_kc, cache_n), got_v = be.read_compute(d_vc, cache_n);
      VecF gk, wk, gv, wv;
      for (int b = 0; b < c.B; ++b) {
        const int64_t o = int64_t{b} * c.maxT * kv_row, n = int64_t{L} * kv_row;
        gk.insert(gk.end(), got_k.begin() + o, got_k.begin() + o + n);
        wk.insert(wk.end(), kc.begin() + o, kc.begin() + o + n);
        gv.insert(gv.end(), got_v.begin() + o, got_v.begin() + o + n);
        wv.insert(wv.end(), vc.begin() + o, vc.begin() + o + n);
      }
      EXPECT_TRUE(test::close(gk, wk, 0.0));
      EXPECT_TRUE(test::close(gv, wv, 0.0));

      // The new rows of the CPU's attention over the whole sequence.
      VecF out_full(int64_t{c.B} * L * O), lse_full(int64_t{c.B} * c.NH * L);
      be.cpu->attention_forward(out_full.data(), lse_full.data(), qkv.data(), full);
      VecF want_rows;
      for (int b = 0; b < c.B; ++b) {
        const float* src = out_full.data() + (int64_t{b} * L + c.pos0) * O;
        want_rows.insert(want_rows.end(), src, src + int64_t{c.Tq} * O);
      }
      EXPECT_TRUE(test::close(be.read_compute(d_out, static_cast<int64_t>(out.size())), want_rows,
                              test::tolerance(dt)));
    }
  }
}

AttentionShape make(int B, int T, int NH, int KVH, int HS, int window = 0) {
  return attention_shape(Shape{B, T, NH, KVH, HS, window});
}

TEST(CudaAttentionHeads, RejectsShapesItCannotRun) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  auto be = make_cuda_backend(DType::kBF16);
  EXPECT_THROW(be->attention_forward(nullptr, nullptr, nullptr, make(1, 4, 1, 1, 512)), Error);
  EXPECT_THROW(be->attention_forward(nullptr, nullptr, nullptr, make(1, 4, 3, 2, 64)), Error);
  EXPECT_THROW(be->attention_forward(nullptr, nullptr, nullptr, make(1, 4, 2, 0, 64)), Error);
  EXPECT_THROW(be->attention_forward(nullptr, nullptr, nullptr, make(1, 4, 2, 2, 64, -1)), Error);
  EXPECT_THROW(
      be->attention_backward(nullptr, nullptr, nullptr, nullptr, nullptr, make(1, 4, 4, 3, 32)),
      Error);
  // A cache too short for the new positions.
  EXPECT_THROW(
      be->attention_kv_cache(nullptr, nullptr, nullptr, nullptr, 6, 8, make(1, 3, 2, 1, 64)),
      Error);
  EXPECT_THROW(
      be->attention_kv_cache(nullptr, nullptr, nullptr, nullptr, -1, 8, make(1, 1, 2, 1, 64)),
      Error);
}

}  // namespace
}  // namespace zerod
