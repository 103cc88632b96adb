#include "kernels/cpu/crossentropy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernel_test_util.h"
#include "kernels/backend.h"
#include "kernels/cpu/cast.h"

namespace zerod::cpu {
namespace {

using test::VecD;
using test::VecF;

// losses[n] = logsumexp(logits[n, :V]) - logits[n, target], 0 for target < 0; in double.
VecD ce_ref(const VecD& logits, const std::vector<int32_t>& targets, int64_t N, int V, int Vp) {
  VecD loss(N, 0.0);
  for (int64_t n = 0; n < N; ++n) {
    if (targets[n] < 0) continue;
    const double* x = &logits[n * Vp];
    double m = -INFINITY;
    for (int j = 0; j < V; ++j) m = std::max(m, x[j]);
    double s = 0.0;
    for (int j = 0; j < V; ++j) s += std::exp(x[j] - m);
    loss[n] = m + std::log(s) - x[targets[n]];
  }
  return loss;
}

struct CeCase {
  int64_t N;
  int V, Vp;
  std::vector<int32_t> targets;
};

VecF ce_logits(const CeCase& c, uint64_t seed) {
  VecF x = test::randn(c.N * c.Vp, seed, 3.0f);
  // Row 1 sits at +1000: a naive exp would overflow; the padding holds huge values that must be
  // ignored.
  for (int j = 0; j < c.Vp; ++j) x[c.Vp + j] += 1000.0f;
  for (int64_t n = 0; n < c.N; ++n)
    for (int j = c.V; j < c.Vp; ++j) x[n * c.Vp + j] = 1e30f;
  return x;
}

const CeCase kCase{7, 37, 40, {5, 36, -1, 0, 12, -100, 20}};

TEST(CrossEntropy, ForwardMatchesReference) {
  const CeCase& c = kCase;
  const VecF x = ce_logits(c, 400);
  VecF loss(c.N, test::kNaN);
  crossentropy_forward(loss.data(), x.data(), c.targets.data(), c.N, c.V, c.Vp);
  const VecD ref = ce_ref(test::to_double(x), c.targets, c.N, c.V, c.Vp);
  for (int64_t n = 0; n < c.N; ++n) {
    // Row 1 (logits ~1000) included: the loss is formed as log(sum) + (max - x[target]),
    // whose difference is exact, so no absolute error of the logits' magnitude creeps in.
    EXPECT_NEAR(loss[n], ref[n], 1e-5 + 1e-6 * ref[n]) << "row " << n;
  }
  EXPECT_EQ(loss[2], 0.0f);  // ignored targets
  EXPECT_EQ(loss[5], 0.0f);
}

TEST(CrossEntropy, FusedMatchesForwardAndFiniteDifferences) {
  const CeCase& c = kCase;
  const VecF x = ce_logits(c, 410);
  const float dloss = 0.37f;
  VecF loss_fwd(c.N), loss(c.N, test::kNaN);
  crossentropy_forward(loss_fwd.data(), x.data(), c.targets.data(), c.N, c.V, c.Vp);
  VecF d = x;
  crossentropy_fused(loss.data(), d.data(), c.targets.data(), c.N, c.V, c.Vp, dloss);
  for (int64_t n = 0; n < c.N; ++n) EXPECT_NEAR(loss[n], loss_fwd[n], 1e-6 + 1e-6 * loss_fwd[n]);

  // Gradient of dloss * sum_n loss_n over the real vocabulary, by finite differences. The
  // padding columns are excluded from the objective's inputs (they hold 1e30).
  const VecD xd = test::to_double(x);
  auto f = [&](const VecD& v) {
    const VecD l = ce_ref(v, c.targets, c.N, c.V, c.Vp);
    double s = 0.0;
    for (double e : l) s += dloss * e;
    return s;
  };
  std::vector<size_t> idx;
  for (int64_t n = 0; n < c.N; ++n)
    for (int j = 0; j < c.V; ++j) idx.push_back(static_cast<size_t>(n * c.Vp + j));
  // Step 1e-3: row 1's logits are ~1000 and a smaller step would drown in their rounding.
  const VecD want = test::fd_gradient(f, xd, idx, 1e-3);
  EXPECT_LT(test::rel_err(d, want, idx), 1e-5);
  for (int64_t n = 0; n < c.N; ++n) {
    for (int j = c.V; j < c.Vp; ++j) EXPECT_EQ(d[n * c.Vp + j], 0.0f) << "padding " << n;
    if (c.targets[n] < 0) {
      for (int j = 0; j < c.Vp; ++j) EXPECT_EQ(d[n * c.Vp + j], 0.0f) << "ignored row " << n;
    }
  }
}

TEST(CrossEntropy, FusedRoundingEqualsRoundingTheArrayBeforeAndAfter) {
  // round_to bf16/fp16 rounds each row in cache: the same bits as rounding the whole logits,
  // the plain fused kernel, and rounding the whole dlogits. Rows long enough to span several
  // vector blocks and a tail, with padding, an ignored row and values at rounding ties' scale.
  const CeCase c{5, 1037, 1040, {3, -1, 1036, 0, 517}};
  for (DType dt : {DType::kBF16, DType::kF16}) {
    const VecF x = test::randn(c.N * c.Vp, 430, 4.0f);
    VecF want = x, want_loss(c.N), got = x, got_loss(c.N);
    std::vector<uint16_t> bits(static_cast<size_t>(c.N * c.Vp), 0xdead);
    cast_round(want.data(), want.data(), c.N * c.Vp, dt);
    crossentropy_fused(want_loss.data(), want.data(), c.targets.data(), c.N, c.V, c.Vp, 0.25f);
    cast_round(want.data(), want.data(), c.N * c.Vp, dt);
    crossentropy_fused(got_loss.data(), got.data(), c.targets.data(), c.N, c.V, c.Vp, 0.25f, dt,
                       dt == DType::kBF16 ? bits.data() : nullptr);
    for (int64_t n = 0; n < c.N; ++n) EXPECT_EQ(got_loss[n], want_loss[n]) << "row " << n;
    int64_t differ = 0, unrounded = 0;
    for (int64_t i = 0; i < c.N * c.Vp; ++i) {
      differ += got[i] != want[i];
      unrounded += dt == DType::kBF16 ? got[i] != round_bf16(got[i]) : got[i] != round_f16(got[i]);
    }
    EXPECT_EQ(differ, 0) << dtype_name(dt);
    if (dt == DType::kBF16) {  // the bf16 copy of dlogits: every element, padding included
      int64_t wrong_bits = 0;
      for (int64_t i = 0; i < c.N * c.Vp; ++i) wrong_bits += bits[i] != f32_to_bf16_bits(got[i]);
      EXPECT_EQ(wrong_bits, 0);
    }
    EXPECT_EQ(unrounded, 0) << dtype_name(dt);
    // Without round_to the kernel neither rounds the input nor the output: a different result.
    VecF plain = x, plain_loss(c.N);
    crossentropy_fused(plain_loss.data(), plain.data(), c.targets.data(), c.N, c.V, c.Vp, 0.25f);
    int64_t plain_differ = 0;
    for (int64_t i = 0; i < c.N * c.Vp; ++i) plain_differ += plain[i] != got[i];
    EXPECT_GT(plain_differ, c.N * c.V / 2) << dtype_name(dt);
  }
}

TEST(CrossEntropy, LargeVocabularyRowSumsToZero) {
  // One row of a GPT-2 sized vocabulary: softmax - onehot sums to 0 and the loss matches.
  const int V = 50257, Vp = 50304;
  const VecF x = test::randn(Vp, 420, 2.0f);
  const std::vector<int32_t> t = {12345};
  VecF d = x, loss(1);
  crossentropy_fused(loss.data(), d.data(), t.data(), 1, V, Vp, 1.0f);
  const VecD ref = ce_ref(test::to_double(x), t, 1, V, Vp);
  EXPECT_NEAR(loss[0], ref[0], 1e-5 * ref[0]);
  double s = 0.0, mx = 0.0;
  for (int j = 0; j < V; ++j) {
    s += d[j];
    mx = std::max(mx, std::fabs(static_cast<double>(d[j])));
  }
  EXPECT_NEAR(s, 0.0, 1e-5);
  EXPECT_NEAR(d[12345], std::exp(-ref[0]) - 1.0, 1e-6);
}

TEST(CrossEntropy, RejectsTargetsOutsideTheVocabulary) {
  VecF x(2 * 8), loss(2);
  const std::vector<int32_t> t = {1, 6};  // V = 6: target 6 is out of range
  EXPECT_ANY_THROW(crossentropy_forward(loss.data(), x.data(), t.data(), 2, 6, 8));
  EXPECT_ANY_THROW(crossentropy_fused(loss.data(), x.data(), t.data(), 2, 6, 8, 1.0f));
}

// ---- vocabulary-parallel cross-entropy ------------------------------------------------------

// The vocabulary-parallel loss of logits (N,Vp) as S ranks and their caller compute it: rank s
// holds the columns [v0, v0 + Vl) (Vl = Vp/S, v0 = s*Vl), of which real = clamp(V - v0, 0, Vl)
// are real; between the steps the statistics are combined over the ranks (max of the maxima,
// sums of the target logits and of the sums of exp, in rank order) and every rank continues with
// the combined values.
struct Sharded {
  std::vector<VecF> stats1;  // (3N) per rank after step 1 (only [0,2N) written)
  VecF combined;             // (3N) all statistics combined
  std::vector<VecF> losses;  // (N) per rank
  VecF dlogits;              // (N,Vp) the ranks' dlogits side by side
  std::vector<int> real;     // per rank
};

Sharded sharded_ce(Backend& be, const VecF& x, const std::vector<int32_t>& targets, int64_t N,
                   int V, int Vp, int S, float dloss) {
  const int Vl = Vp / S;
  Sharded r;
  r.dlogits.assign(static_cast<size_t>(N * Vp), test::kNaN);
  std::vector<VecF> logits(S), stats(S, VecF(static_cast<size_t>(3 * N), test::kNaN));
  for (int s = 0; s < S; ++s) {
    const int v0 = s * Vl;
    r.real.push_back(std::clamp(V - v0, 0, Vl));
    logits[s].resize(static_cast<size_t>(N * Vl));
    for (int64_t n = 0; n < N; ++n)
      for (int j = 0; j < Vl; ++j) logits[s][n * Vl + j] = x[n * Vp + v0 + j];
  }
  // Step 1, then max and sum over the ranks.
  for (int s = 0; s < S; ++s)
    be.crossentropy_shard_stats(stats[s].data(), logits[s].data(), targets.data(), N, r.real[s], Vl,
                                s * Vl);
  r.stats1 = stats;
  r.combined.assign(static_cast<size_t>(3 * N), 0.0f);
  for (int64_t n = 0; n < N; ++n) {
    r.combined[n] = -std::numeric_limits<float>::infinity();
    for (int s = 0; s < S; ++s) {
      r.combined[n] = std::max(r.combined[n], stats[s][n]);
      r.combined[N + n] += stats[s][N + n];
    }
  }
  // Step 2 with the combined max, then the sum over the ranks.
  for (int s = 0; s < S; ++s) {
    std::copy(r.combined.begin(), r.combined.begin() + 2 * N, stats[s].begin());
    be.crossentropy_shard_sumexp(stats[s].data(), logits[s].data(), N, r.real[s], Vl);
  }
  for (int64_t n = 0; n < N; ++n)
    for (int s = 0; s < S; ++s) r.combined[2 * N + n] += stats[s][2 * N + n];
  // Step 3 on every rank.
  for (int s = 0; s < S; ++s) {
    VecF loss(static_cast<size_t>(N), test::kNaN);
    be.crossentropy_shard_finish(loss.data(), logits[s].data(), targets.data(), r.combined.data(),
                                 N, r.real[s], Vl, s * Vl, dloss);
    r.losses.push_back(loss);
    for (int64_t n = 0; n < N; ++n)
      for (int j = 0; j < Vl; ++j) r.dlogits[n * Vp + s * Vl + j] = logits[s][n * Vl + j];
  }
  return r;
}

// V = 35 real columns of Vp = 48: with S = 2, 3, 4 ranks of Vl = 24, 16, 12 columns the last
// rank holds 11, 3 and 0 (only padding) real columns. The targets sit on the first and the last
// real column of every rank of each split, plus rows without loss.
const CeCase kShardCase{
    16, 35, 48, {0, 11, 12, 15, 16, 23, 24, -1, 31, 32, 34, 7, -100, 27, 19, 3}};

TEST(CrossEntropyShards, StepsCombinedOverOneToFourShardsEqualTheFusedLoss) {
  const CeCase& c = kShardCase;
  const float dloss = 0.37f;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(dt));
    auto be = make_cpu_backend(dt);
    VecF x = ce_logits(c, 430);  // row 1 at +1000, padding 1e30
    be->round_to_compute(x.data(), static_cast<int64_t>(x.size()));
    // The fused kernel without the bf16 backend's rounding of dlogits (the shard steps leave
    // that to their caller): the same arithmetic on the same (rounded) logits.
    VecF loss_ref(c.N, test::kNaN), d_ref = x;
    crossentropy_fused(loss_ref.data(), d_ref.data(), c.targets.data(), c.N, c.V, c.Vp, dloss);
    for (int S = 1; S <= 4; ++S) {
      SCOPED_TRACE("S=" + std::to_string(S));
      const Sharded r = sharded_ce(*be, x, c.targets, c.N, c.V, c.Vp, S, dloss);
      for (int64_t n = 0; n < c.N; ++n) {
        const int32_t t = c.targets[n];
        // The combined statistics: the row max over the real columns and the target's logit,
        // exactly.
        float m = -std::numeric_limits<float>::infinity();
        for (int j = 0; j < c.V; ++j) m = std::max(m, x[n * c.Vp + j]);
        EXPECT_EQ(r.combined[n], m) << "row " << n;
        EXPECT_EQ(r.combined[c.N + n], t >= 0 ? x[n * c.Vp + t] : 0.0f) << "row " << n;
        // Every rank computes the same losses, equal to the fused op's up to the summation
        // order of the sum of exp.
        for (int s = 0; s < S; ++s) {
          EXPECT_NEAR(r.losses[s][n], loss_ref[n], 1e-6 * std::fabs(loss_ref[n]) + 1e-7)
              << "row " << n << " rank " << s;
          EXPECT_EQ(r.losses[s][n], r.losses[0][n]) << "row " << n << " rank " << s;
        }
        if (t < 0) {
          EXPECT_EQ(r.losses[0][n], 0.0f) << "ignored row " << n;
        }
      }
      // dlogits side by side equal the fused op's (padding and ignored rows exactly 0) within a
      // few ulps of dloss (the sums of exp differ in summation order; measured: 3 ulps).
      for (int64_t n = 0; n < c.N; ++n) {
        for (int j = 0; j < c.Vp; ++j) {
          const size_t i = static_cast<size_t>(n * c.Vp + j);
          if (j >= c.V || c.targets[n] < 0) {
            ASSERT_EQ(r.dlogits[i], 0.0f) << "row " << n << " column " << j;
          } else {
            ASSERT_NEAR(r.dlogits[i], d_ref[i], 2e-7) << "row " << n << " column " << j;
          }
        }
      }
      // A rank holding only padding: max -inf, no target logit, no sum of exp.
      for (int s = 0; s < S; ++s) {
        if (r.real[s] > 0) continue;
        for (int64_t n = 0; n < c.N; ++n) {
          EXPECT_EQ(r.stats1[s][n], -std::numeric_limits<float>::infinity());
          EXPECT_EQ(r.stats1[s][c.N + n], 0.0f);
        }
      }
    }
  }
}

TEST(CrossEntropyShards, EachStepComputesItsShare) {
  // Three rows of 4 real + 2 padding columns at v0 = 10 (global columns 10..15).
  auto be = make_cpu_backend(DType::kF32);
  const int64_t N = 3;
  const int real = 4, Vl = 6, v0 = 10;
  const VecF x = {1, 5, 2, -1, 99, 99,  //
                  0, 0, 3, 4,  99, 99,  //
                  2, 2, 2, 2,  99, 99};
  const std::vector<int32_t> t = {11, 7, 13};  // in this shard, before it, at its last column
  VecF stats(3 * N, test::kNaN);
  be->crossentropy_shard_stats(stats.data(), x.data(), t.data(), N, real, Vl, v0);
  EXPECT_EQ(stats[0], 5.0f);
  EXPECT_EQ(stats[1], 4.0f);
  EXPECT_EQ(stats[2], 2.0f);
  EXPECT_EQ(stats[N + 0], 5.0f);  // x[0, 11 - 10]
  EXPECT_EQ(stats[N + 1], 0.0f);  // another shard's column
  EXPECT_EQ(stats[N + 2], 2.0f);  // x[2, 13 - 10]
  // Step 2 with a combined max of 6 in every row (another shard's column held it).
  stats[0] = stats[1] = stats[2] = 6.0f;
  be->crossentropy_shard_sumexp(stats.data(), x.data(), N, real, Vl);
  for (int64_t n = 0; n < N; ++n) {
    double s = 0.0;
    for (int j = 0; j < real; ++j) s += std::exp(static_cast<double>(x[n * Vl + j]) - 6.0);
    EXPECT_NEAR(stats[2 * N + n], s, 1e-6 * s) << "row " << n;
  }
  // Step 3 from given totals: loss = log(sumexp) + max - target logit; dlogits of the local
  // columns only (the onehot term where the target is local).
  const VecF total = {6.0f, 6.0f, 6.0f, 5.0f, 1.5f, 2.0f, 3.0f, 2.0f, 4.0f};
  VecF d = x, loss(N, test::kNaN);
  const float dloss = 2.0f;
  be->crossentropy_shard_finish(loss.data(), d.data(), t.data(), total.data(), N, real, Vl, v0,
                                dloss);
  for (int64_t n = 0; n < N; ++n) {
    const double m = total[n], xt = total[N + n], s = total[2 * N + n];
    EXPECT_NEAR(loss[n], std::log(s) + m - xt, 1e-6) << "row " << n;
    for (int j = 0; j < Vl; ++j) {
      double want = 0.0;
      if (j < real) {
        want = dloss * std::exp(static_cast<double>(x[n * Vl + j]) - m) / s;
        if (v0 + j == t[n]) want -= dloss;
      }
      EXPECT_NEAR(d[n * Vl + j], want, 1e-6) << "row " << n << " column " << j;
    }
  }
}

TEST(CrossEntropyShards, LargeVocabularyInFourShards) {
  // GPT-2's vocabulary in 4 shards of 12576 columns (the last with 12529 real ones).
  auto be = make_cpu_backend(DType::kF32);
  const int V = 50257, Vp = 50304;
  const int64_t N = 2;
  const VecF x = test::randn(N * Vp, 440, 2.0f);
  const std::vector<int32_t> t = {12345, V - 1};
  VecF loss_ref(N), d_ref = x;
  be->crossentropy_fused(loss_ref.data(), d_ref.data(), t.data(), N, V, Vp, 0.5f);
  const Sharded r = sharded_ce(*be, x, t, N, V, Vp, 4, 0.5f);
  for (int64_t n = 0; n < N; ++n) EXPECT_NEAR(r.losses[3][n], loss_ref[n], 1e-6 * loss_ref[n]);
  double err = 0.0;
  for (size_t i = 0; i < x.size(); ++i)
    err = std::max(err, std::fabs(static_cast<double>(r.dlogits[i]) - d_ref[i]));
  EXPECT_LT(err, 1e-7);  // one rounding of the target column's -0.5
}

TEST(CrossEntropyShards, RejectsTargetsInTheShardPaddingAndBadShapes) {
  auto be = make_cpu_backend(DType::kF32);
  VecF x(2 * 4, 0.0f), stats(3 * 2, 0.0f), loss(2);
  // The shard [4, 8) holds 2 real columns: target 6 is beyond the vocabulary (V = 6).
  const std::vector<int32_t> t = {1, 6};
  EXPECT_ANY_THROW(be->crossentropy_shard_stats(stats.data(), x.data(), t.data(), 2, 2, 4, 4));
  EXPECT_ANY_THROW(be->crossentropy_shard_finish(loss.data(), x.data(), t.data(), stats.data(), 2,
                                                 2, 4, 4, 1.0f));
  // The shard [0, 4) cannot tell: target 6 is another shard's.
  EXPECT_NO_THROW(be->crossentropy_shard_stats(stats.data(), x.data(), t.data(), 2, 4, 4, 0));
  // real outside [0, Vl].
  EXPECT_ANY_THROW(be->crossentropy_shard_stats(stats.data(), x.data(), t.data(), 2, 5, 4, 0));
  EXPECT_ANY_THROW(be->crossentropy_shard_sumexp(stats.data(), x.data(), 2, -1, 4));
}

}  // namespace
}  // namespace zerod::cpu
