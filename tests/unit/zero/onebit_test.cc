// OneBitAdam's step past the freeze (zero/onebit.h) on two ranks (threads over Gloo) equals a
// one-process reference of the same algorithm: each rank's momentum from its own gradients, the
// plain compressed all-reduce reference, the mask outside the tensors, the frozen-variance
// update; three steps, bitwise, every rank.
#include "zero/onebit.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "core/rng.h"
#include "tests/unit/comm/comm_test_util.h"
#include "tests/unit/comm/compressed_reference.h"

namespace zerod {
namespace {

using test::S;

ModelSpec small_spec() {
  ModelSpec s;
  s.n_layer = 2;
  s.n_head = 2;
  s.n_embd = 20;
  s.vocab_size = 50;  // padded: rows past 50 are masked
  s.seq_len = 7;
  return s;
}

std::vector<float> randoms(uint64_t seed, int64_t n, float lo, float hi) {
  Rng rng(seed);
  std::vector<float> v(S(n));
  for (auto& x : v) x = lo + (hi - lo) * static_cast<float>(rng.uniform01());
  return v;
}

TEST(OnebitAdam, CompressedStepsMatchAOneProcessReference) {
  const int world = 2;
  const ParamLayout layout(small_spec());
  const Partition part(layout, 1);
  const int units = layout.num_units();
  OnebitConfig cfg;
  cfg.freeze_step = 0;
  // Per rank and unit: master, m, v (equal on both ranks, as after a warm-up), gradients (not).
  struct Rank {
    std::vector<std::vector<float>> master, m, v, g;
  };
  std::vector<Rank> ranks(world);
  for (int r = 0; r < world; ++r) {
    for (int u = 0; u < units; ++u) {
      const int64_t n = part.unit(u).shard;
      ranks[S(r)].master.push_back(randoms(10 + u, n, -1, 1));
      ranks[S(r)].m.push_back(randoms(20 + u, n, -0.1f, 0.1f));
      ranks[S(r)].v.push_back(randoms(30 + u, n, 1e-4f, 1e-2f));
      ranks[S(r)].g.push_back(randoms(100 * r + u, n, -4, 4));  // x loss scale 4
    }
  }
  std::vector<Rank> want = ranks;
  OnebitStep s;
  s.lr = 1e-2;
  s.beta1 = 0.9;
  s.weight_decay = 0.1;
  s.eps = 1e-8;
  s.grad_scale = 0.25f;

  auto w = test::make_world(world);
  std::vector<test::CompressedReference> refs;
  for (int u = 0; u < units; ++u) refs.emplace_back(world, part.unit(u).shard);
  std::vector<std::unique_ptr<OnebitOptimizer>> opts;
  for (int r = 0; r < world; ++r)
    opts.push_back(
        std::make_unique<OnebitOptimizer>(OnebitKind::kAdam, cfg, layout, part, *w.comms[S(r)]));
  for (int step = 1; step <= 3; ++step) {
    s.step = step;
    // The reference.
    for (int u = 0; u < units; ++u) {
      const int64_t n = part.unit(u).shard;
      std::vector<std::vector<float>> ms;
      for (int r = 0; r < world; ++r) {
        auto& m = want[S(r)].m[S(u)];
        const auto& g = want[S(r)].g[S(u)];
        for (int64_t i = 0; i < n; ++i) {
          const float t = m[S(i)] * static_cast<float>(s.beta1);
          m[S(i)] = t + static_cast<float>(1.0 - s.beta1) * (g[S(i)] * s.grad_scale);
        }
        ms.push_back(m);
      }
      std::vector<float> avg = refs[S(u)].run(ms);
      // The mask: elements of no tensor, and the padded vocabulary rows, are 0.
      std::vector<bool> live(S(n), false);
      for (const TensorInfo& t : layout.unit(u).tensors) {
        const int64_t rows = t.real_rows >= 0 ? t.real_rows : t.shape[0];
        for (int64_t i = 0; i < t.numel / t.shape[0] * rows; ++i) live[S(t.offset + i)] = true;
      }
      for (int64_t i = 0; i < n; ++i)
        if (!live[S(i)]) avg[S(i)] = 0.0f;
      for (int r = 0; r < world; ++r) {
        want[S(r)].m[S(u)] = avg;
        auto& p = want[S(r)].master[S(u)];
        const auto& v = want[S(r)].v[S(u)];
        for (const DecayRange& d : part.decay_ranges(u)) {
          for (int64_t i = d.begin; i < d.end; ++i) {
            float upd = avg[S(i)] / (std::sqrt(v[S(i)]) + static_cast<float>(s.eps));
            if (d.decay) upd += static_cast<float>(s.weight_decay) * p[S(i)];
            p[S(i)] += static_cast<float>(-s.lr) * upd;
          }
        }
      }
    }
    // The optimizer on two ranks.
    test::run_ranks(world, [&](int r) {
      Rank& x = ranks[S(r)];
      std::vector<OnebitUnit> us;
      for (int u = 0; u < units; ++u)
        us.push_back({x.master[S(u)].data(), x.m[S(u)].data(), x.v[S(u)].data(), x.g[S(u)].data(),
                      part.unit(u).shard});
      opts[S(r)]->compressed_step(us, s);
    });
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(ranks[S(r)].m, want[S(r)].m) << "rank " << r << " step " << step;
      ASSERT_EQ(ranks[S(r)].master, want[S(r)].master) << "rank " << r << " step " << step;
    }
  }
  EXPECT_NE(ranks[0].master[1], randoms(11, part.unit(1).shard, -1, 1));  // it moved
}

}  // namespace
}  // namespace zerod
