#include "kernels/cpu/crossentropy.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.h"

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

}  // namespace
}  // namespace zerod::cpu
