// Ring attention's block ops of the CUDA backend (kernels/cuda/attention_block.h) against the CPU
// reference (metric and limits: cuda_test_util.h): one rank's queries meet every key/value block
// of a split sequence (load-balanced causal chunks r and 2C-1-r, and random positions in random
// order), forward merging over the blocks, backward accumulating dQ and each block's dK/dV (the
// first contribution written into a NaN-poisoned buffer, the next added); MHA, GQA, windows and
// head sizes of 1, 2, 4 and 8 channels per lane; and copy_2d. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <string>

#include "core/rng.h"
#include "cuda_test_util.h"
#include "kernels/cuda/attention.h"

namespace zerod {
namespace {

using test::Backends;
using test::VecF;
using test::VecI;

struct Case {
  int B, T, NH, KVH, HS, window, C;
  bool random;  // random position sets (unsorted) instead of the load-balanced split
};

constexpr Case kCases[] = {
    {2, 100, 3, 3, 16, 0, 2, false},   {1, 150, 4, 2, 64, 0, 3, false},
    {2, 90, 4, 1, 80, 0, 2, true},     {1, 70, 2, 2, 256, 0, 2, false},
    {1, 130, 4, 2, 32, 17, 2, false},  {2, 120, 2, 1, 64, 40, 3, true},
    {1, 45, 3, 3, 128, 100, 4, false},
};

std::vector<VecI> split(const Case& c) {
  std::vector<VecI> ranks(static_cast<size_t>(c.C));
  if (c.random) {
    VecI all(static_cast<size_t>(c.T));
    std::iota(all.begin(), all.end(), 0);
    Rng rng(77, 7);
    for (size_t i = all.size() - 1; i > 0; --i) std::swap(all[i], all[rng.uniform(i + 1)]);
    for (int t = 0; t < c.T; ++t) ranks[static_cast<size_t>(t % c.C)].push_back(all[t]);
    return ranks;
  }
  const int n = 2 * c.C;
  for (int r = 0; r < c.C; ++r) {
    for (int k : {r, n - 1 - r}) {
      for (int t = k * c.T / n; t < (k + 1) * c.T / n; ++t) ranks[r].push_back(t);
    }
  }
  return ranks;
}

std::string label(DType dt, const Case& c) {
  return std::string(dtype_name(dt)) + " B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) +
         " NH=" + std::to_string(c.NH) + " KVH=" + std::to_string(c.KVH) +
         " HS=" + std::to_string(c.HS) + " window=" + std::to_string(c.window) +
         " C=" + std::to_string(c.C) + (c.random ? " random" : " load-balanced");
}

TEST(CudaAttentionBlock, RingOfBlocksMatchesTheCpu) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  for (DType dt : test::kAllDtypes) {
    for (const Case& c : kCases) {
      SCOPED_TRACE(label(dt, c));
      Backends be(dt);
      const std::vector<VecI> ranks = split(c);
      const int64_t kvw = int64_t{2} * c.KVH * c.HS;
      // Rank 1's queries (rank 0 for C = 1) against every block, starting with its own.
      const int me = std::min(1, c.C - 1);
      const VecI& qpos = ranks[me];
      AttentionShape s{c.B, static_cast<int>(qpos.size()), c.NH, c.KVH, c.HS, c.window};
      const int64_t BT = int64_t{c.B} * s.T;
      const VecF qkv = be.round(test::randn(BT * s.qkv_row(), 200, 1.5f));
      const VecF dout = be.round(test::randn(BT * s.out_row(), 201));
      std::vector<VecF> kv;
      for (int r = 0; r < c.C; ++r) {
        kv.push_back(be.round(test::randn(int64_t{c.B} * ranks[r].size() * kvw, 210 + r, 1.5f)));
      }
      Buffer d_qkv = be.compute(qkv), d_dout = be.compute(dout), d_qpos = be.i32(qpos);
      std::vector<Buffer> d_kv, d_kpos;
      for (int r = 0; r < c.C; ++r) {
        d_kv.push_back(be.compute(kv[r]));
        d_kpos.push_back(be.i32(ranks[r]));
      }

      // Forward over the blocks in ring order; the CPU rounds out where the GPU stores it.
      VecF out(BT * s.out_row()), lse(int64_t{c.B} * c.NH * s.T);
      Buffer d_out = be.poisoned_compute(BT * s.out_row());
      Buffer d_lse = be.poisoned_f32(static_cast<int64_t>(lse.size()));
      for (int step = 0; step < c.C; ++step) {
        const int blk = ((me - step) % c.C + c.C) % c.C;
        const int Tk = static_cast<int>(ranks[blk].size());
        be.cpu->attention_block_forward(out.data(), lse.data(), qkv.data(), qpos.data(),
                                        kv[blk].data(), ranks[blk].data(), Tk, s, step == 0);
        out = be.round(out);
        be.gpu->attention_block_forward(d_out.data(), d_lse.as<float>(), d_qkv.data(),
                                        d_qpos.as<int32_t>(), d_kv[blk].data(),
                                        d_kpos[blk].as<int32_t>(), Tk, s, step == 0);
        SCOPED_TRACE("after block " + std::to_string(blk));
        EXPECT_TRUE(
            test::close(be.read_compute(d_out, BT * s.out_row()), out, test::tolerance(dt)));
        EXPECT_TRUE(test::close(be.read_f32(d_lse, static_cast<int64_t>(lse.size())), lse,
                                dt == DType::kF32 ? 1e-5 : 1e-3));
      }

      // Backward from the CPU's final out and lse (both sides read the same values): dQ
      // accumulates over the blocks; each block's dK/dV is written, then added to once more.
      Buffer d_fout = be.compute(out), d_flse = be.f32(lse);
      VecF dqkv(BT * s.qkv_row(), 0.0f);
      Buffer d_dqkv = be.compute(dqkv);
      for (int step = 0; step < c.C; ++step) {
        const int blk = ((me - step) % c.C + c.C) % c.C;
        const int Tk = static_cast<int>(ranks[blk].size());
        const int64_t n_kv = int64_t{c.B} * Tk * kvw;
        const VecF dkv_in = be.round(test::randn(n_kv, 300 + blk));
        VecF dkv(n_kv, std::numeric_limits<float>::quiet_NaN()), dkv_acc = dkv_in;
        be.cpu->attention_block_backward(dqkv.data(), dkv.data(), dout.data(), qkv.data(),
                                         qpos.data(), kv[blk].data(), ranks[blk].data(), Tk,
                                         out.data(), lse.data(), s, false);
        be.cpu->attention_block_backward(dqkv.data(), dkv_acc.data(), dout.data(), qkv.data(),
                                         qpos.data(), kv[blk].data(), ranks[blk].data(), Tk,
                                         out.data(), lse.data(), s, true);
        // (dQ went in twice on the CPU: the GPU does the same.)
        Buffer d_dkv = be.poisoned_compute(n_kv), d_dkv_acc = be.compute(dkv_in);
        be.gpu->attention_block_backward(d_dqkv.data(), d_dkv.data(), d_dout.data(), d_qkv.data(),
                                         d_qpos.as<int32_t>(), d_kv[blk].data(),
                                         d_kpos[blk].as<int32_t>(), Tk, d_fout.data(),
                                         d_flse.as<float>(), s, false);
        be.gpu->attention_block_backward(d_dqkv.data(), d_dkv_acc.data(), d_dout.data(),
                                         d_qkv.data(), d_qpos.as<int32_t>(), d_kv[blk].data(),
                                         d_kpos[blk].as<int32_t>(), Tk, d_fout.data(),
                                         d_flse.as<float>(), s, true);
        SCOPED_TRACE("backward block " + std::to_string(blk));
        EXPECT_TRUE(test::close(be.read_compute(d_dkv, n_kv), dkv, test::tolerance(dt)));
        EXPECT_TRUE(test::close(be.read_compute(d_dkv_acc, n_kv), dkv_acc, test::tolerance(dt)));
      }
      EXPECT_TRUE(
          test::close(be.read_compute(d_dqkv, BT * s.qkv_row()), dqkv, 2 * test::tolerance(dt)));
    }
  }
}

TEST(CudaAttentionBlock, Copy2dPacksKeyValueColumns) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  for (DType dt : test::kAllDtypes) {
    Backends be(dt);
    const int64_t rows = 37, R = 40, col = 16, cols = 24;
    const VecF x = be.round(test::randn(rows * R, 400));
    Buffer d_x = be.compute(x), d_y = be.poisoned_compute(rows * cols);
    be.gpu->copy_2d(d_y.data(), cols,
                    static_cast<const char*>(d_x.data()) +
                        col * static_cast<int64_t>(be.gpu->compute_elem_size()),
                    R, rows, cols);
    VecF want(rows * cols);
    be.cpu->copy_2d(want.data(), cols, x.data() + col, R, rows, cols);
    EXPECT_TRUE(test::close(be.read_compute(d_y, rows * cols), want, 0.0));
  }
}

}  // namespace
}  // namespace zerod
