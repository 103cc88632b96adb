// Softmax cross-entropy of the CUDA backend against the CPU reference (metric and limits:
// cuda_test_util.h). Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

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

// ---- vocabulary-parallel cross-entropy -------------------------------------------------------
// V = 1000 real columns of Vp = 1536 in S = 1..4 shards of Vl = Vp/S columns: the last shard
// holds only padding for S = 3 (Vl 512: 512, 488, 0 real) and S = 4 (Vl 384: 384, 384, 232, 0).
// Each step runs on both backends from the same inputs; the statistics are combined over the
// shards on the host between the steps, as the caller would.
constexpr int kShardV = 1000, kShardVp = 1536;

// Targets on the first and the last real column of every shard of every split, and rows
// without loss.
VecI shard_targets() {
  VecI t = test::randi(N, 150, 0, kShardV);
  const int at[] = {0, 383, 384, 511, 512, 767, 768, 999};
  for (int i = 0; i < 8; ++i) t[2 + i] = at[i];
  t[11] = -1;
  t[N - 1] = -5;
  return t;
}

// The columns [v0, v0 + Vl) of x (N, kShardVp).
VecF columns(const VecF& x, int v0, int Vl) {
  VecF out(static_cast<size_t>(N) * Vl);
  for (int64_t n = 0; n < N; ++n)
    for (int j = 0; j < Vl; ++j) out[n * Vl + j] = x[n * kShardVp + v0 + j];
  return out;
}

TEST(CudaCrossEntropy, ShardStepsMatchTheCpuAndTheFusedLoss) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (DType dt : test::kAllDtypes) {
    SCOPED_TRACE(dtype_name(dt));
    Backends be(dt);
    const VecI tgt = shard_targets();
    const VecF logits = be.round(test::randn(N * kShardVp, 151, 2.0f));
    const float dloss = 0.75f / static_cast<float>(N);
    VecF fused_losses(N), fused_d = logits;
    be.cpu->crossentropy_fused(fused_losses.data(), fused_d.data(), tgt.data(), N, kShardV,
                               kShardVp, dloss);
    Buffer d_tgt = be.i32(tgt);
    for (int S = 1; S <= 4; ++S) {
      SCOPED_TRACE("S=" + std::to_string(S));
      const int Vl = kShardVp / S;
      std::vector<VecF> x(S);
      std::vector<Buffer> d_x;
      std::vector<int> real(S);
      for (int s = 0; s < S; ++s) {
        real[s] = std::clamp(kShardV - s * Vl, 0, Vl);
        x[s] = columns(logits, s * Vl, Vl);
        d_x.push_back(be.compute(x[s]));
      }
      // Step 1: max and target logit, exactly the CPU's (same values, same max); then combined.
      VecF comb(3 * N, 0.0f);
      for (int64_t n = 0; n < N; ++n) comb[n] = -kInf;
      for (int s = 0; s < S; ++s) {
        VecF stats(3 * N);
        be.cpu->crossentropy_shard_stats(stats.data(), x[s].data(), tgt.data(), N, real[s], Vl,
                                         s * Vl);
        Buffer d_stats = be.poisoned_f32(3 * N);
        be.gpu->crossentropy_shard_stats(d_stats.as<float>(), d_x[s].data(), d_tgt.as<int32_t>(), N,
                                         real[s], Vl, s * Vl);
        const VecF got = be.read_f32(d_stats, 3 * N);
        for (int64_t i = 0; i < 2 * N; ++i)
          ASSERT_EQ(got[i], stats[i]) << "shard " << s << " " << i;
        if (real[s] == 0) {
          EXPECT_EQ(got[0], -kInf);
        }
        for (int64_t n = 0; n < N; ++n) {
          comb[n] = std::max(comb[n], got[n]);
          comb[N + n] += got[N + n];
        }
      }
      // Step 2 from the combined max: the sums of exp within fp32 summation order; then summed.
      VecF sums(N, 0.0f);
      for (int s = 0; s < S; ++s) {
        VecF stats = comb;
        be.cpu->crossentropy_shard_sumexp(stats.data(), x[s].data(), N, real[s], Vl);
        Buffer d_stats = be.f32(comb);
        be.gpu->crossentropy_shard_sumexp(d_stats.as<float>(), d_x[s].data(), N, real[s], Vl);
        const VecF got = be.read_f32(d_stats, 3 * N);
        EXPECT_TRUE(test::close(VecF(got.begin(), got.begin() + 2 * N),
                                VecF(stats.begin(), stats.begin() + 2 * N), 0.0));
        const VecF got_s(got.begin() + 2 * N, got.end()),
            want_s(stats.begin() + 2 * N, stats.end());
        EXPECT_TRUE(test::close(got_s, want_s, 1e-5)) << "shard " << s;
        for (int64_t n = 0; n < N; ++n) sums[n] += got_s[n];
      }
      for (int64_t n = 0; n < N; ++n) comb[2 * N + n] = sums[n];
      // Step 3 from the combined statistics: losses (equal to the fused loss's) and dlogits.
      Buffer d_comb = be.f32(comb);
      for (int s = 0; s < S; ++s) {
        VecF losses(N), d = x[s];
        be.cpu->crossentropy_shard_finish(losses.data(), d.data(), tgt.data(), comb.data(), N,
                                          real[s], Vl, s * Vl, dloss);
        Buffer d_losses = be.poisoned_f32(N);
        be.gpu->crossentropy_shard_finish(d_losses.as<float>(), d_x[s].data(), d_tgt.as<int32_t>(),
                                          d_comb.as<float>(), N, real[s], Vl, s * Vl, dloss);
        const VecF got_losses = be.read_f32(d_losses, N);
        EXPECT_TRUE(test::close(got_losses, losses, 1e-5)) << "shard " << s;
        EXPECT_TRUE(test::close(got_losses, fused_losses, 1e-5)) << "shard " << s;
        const VecF dlogits = be.read_compute(d_x[s], N * Vl);
        if (real[s] > 0) {
          EXPECT_TRUE(test::close(dlogits, d, test::tolerance(dt))) << "shard " << s;
        }
        for (int64_t n = 0; n < N; ++n) {
          for (int j = 0; j < Vl; ++j) {
            if (j >= real[s] || tgt[n] < 0) {
              ASSERT_EQ(dlogits[n * Vl + j], 0.0f) << n << " " << j;
            }
          }
        }
      }
    }
  }
}

// A target in a shard's padding (>= the vocabulary size) poisons the loss with NaN, as the fused
// op's target >= V does (the CPU throws instead).
TEST(CudaCrossEntropy, ShardTargetInThePaddingGivesNaN) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  Backends be(DType::kF32);
  const int64_t rows = 2;
  const int real = 6, Vl = 8, v0 = 8;  // global columns 8..15, of which 14 and 15 are padding
  const VecI tgt = {9, 14};
  Buffer d_x = be.compute(test::randn(rows * Vl, 160)), d_tgt = be.i32(tgt);
  Buffer d_stats = be.poisoned_f32(3 * rows);
  be.gpu->crossentropy_shard_stats(d_stats.as<float>(), d_x.data(), d_tgt.as<int32_t>(), rows, real,
                                   Vl, v0);
  be.gpu->crossentropy_shard_sumexp(d_stats.as<float>(), d_x.data(), rows, real, Vl);
  const VecF stats = be.read_f32(d_stats, 3 * rows);
  EXPECT_TRUE(std::isfinite(stats[rows + 0]));
  EXPECT_TRUE(std::isnan(stats[rows + 1]));
  Buffer d_losses = be.poisoned_f32(rows);
  be.gpu->crossentropy_shard_finish(d_losses.as<float>(), d_x.data(), d_tgt.as<int32_t>(),
                                    d_stats.as<float>(), rows, real, Vl, v0, 1.0f);
  const VecF losses = be.read_f32(d_losses, rows);
  EXPECT_TRUE(std::isfinite(losses[0]));
  EXPECT_TRUE(std::isnan(losses[1]));
}

}  // namespace
}  // namespace zerod
