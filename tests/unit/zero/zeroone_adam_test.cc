// ZeroOneAdam (DeepSpeed's 0/1 Adam; zero/onebit.h, zero/zeroone_adam.cc) against a numpy
// re-implementation of DeepSpeed's ZeroOneAdam.step (tests/unit/zero/zeroone_adam_reference.py)
// with its compressed all-reduce, on a small GPT-2's units (padded vocabulary rows masked):
//  - at world 1 and world 2 (threads over Gloo), 20 steps with var_freeze_step 6,
//    var_update_scaler 2, local_step_scaler 2, local_step_clipper 4 and an lr that changes every
//    step: which steps all-reduce their gradients (variance steps at DeepSpeed's counter
//    2, 3, 4, 6; compressed gradients at 5, 7) and which synchronise after the freeze (intervals
//    1, 1, 2, 2, 4, ...), and every rank's weights, momentum and the variance after the last
//    step (a local one: the ranks differ) within 1e-6 of each unit's largest value;
//  - the rank's state written between two synchronisations and read into fresh optimizers whose
//    weights and momentum are rank 0's (what a checkpoint's shards restore) continues bitwise.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "tests/unit/comm/comm_test_util.h"
#include "tests/unit/comm/compressed_reference.h"
#include "tests/unit/zero/onebit_test_util.h"
#include "zero/onebit.h"

namespace zerod {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using test::S;

ModelSpec small_spec() {
  return test::onebit_small_spec();
}

OnebitConfig zeroone_config() {
  OnebitConfig c;
  c.var_freeze_step = 6;
  c.var_update_scaler = 2;
  c.local_step_scaler = 2;
  c.local_step_clipper = 4;
  return c;
}

constexpr int kSteps = 20;
double lr_of(int step) {
  return 1e-2 * (1.0 + 0.05 * step);
}

// Per unit: the live element ranges (the padded vocabulary rows left out).
std::vector<std::vector<std::pair<int64_t, int64_t>>> live_ranges(const ParamLayout& layout) {
  std::vector<std::vector<std::pair<int64_t, int64_t>>> out;
  for (int u = 0; u < layout.num_units(); ++u) {
    out.emplace_back();
    for (const TensorInfo& t : layout.unit(u).tensors) {
      const int64_t rows = t.real_rows >= 0 ? t.real_rows : t.shape[0];
      out.back().emplace_back(t.offset, t.offset + t.numel / t.shape[0] * rows);
    }
  }
  return out;
}

// One rank's states per unit (host fp32, the whole unit at stage 0).
struct States {
  std::vector<std::vector<float>> master, m, v, g;
  explicit States(const Partition& part) {
    for (int u = 0; u < part.num_units(); ++u)
      for (auto* x : {&master, &m, &v, &g}) x->emplace_back(S(part.unit(u).shard), 0.0f);
  }
  std::vector<OnebitUnit> units() {
    std::vector<OnebitUnit> us;
    for (size_t u = 0; u < master.size(); ++u)
      us.push_back({master[u].data(), m[u].data(), v[u].data(), g[u].data(),
                    static_cast<int64_t>(master[u].size())});
    return us;
  }
};

// The job: initial weights and every rank's gradients of every step (0 outside the live
// ranges), drawn here and handed to the reference.
struct Problem {
  std::vector<std::vector<float>> p0;                               // [unit]
  std::vector<std::vector<std::vector<std::vector<float>>>> grads;  // [step][rank][unit]
};
Problem make_problem(const Partition& part,
                     const std::vector<std::vector<std::pair<int64_t, int64_t>>>& live, int world) {
  Problem pr;
  Rng init(5);
  for (int u = 0; u < part.num_units(); ++u) {
    pr.p0.emplace_back(S(part.unit(u).shard), 0.0f);
    for (const auto& [b, e] : live[S(u)])
      for (int64_t i = b; i < e; ++i)
        pr.p0.back()[S(i)] = static_cast<float>(init.uniform01()) - 0.5f;
  }
  for (int step = 1; step <= kSteps; ++step) {
    pr.grads.emplace_back();
    for (int r = 0; r < world; ++r) {
      Rng rng(1000 * step + r);
      pr.grads.back().emplace_back();
      for (int u = 0; u < part.num_units(); ++u) {
        std::vector<float> g(S(part.unit(u).shard), 0.0f);
        for (const auto& [b, e] : live[S(u)])
          for (int64_t i = b; i < e; ++i)
            g[S(i)] = (2.0f - 0.05f * step) * (static_cast<float>(rng.uniform01()) - 0.45f);
        pr.grads.back().back().push_back(std::move(g));
      }
    }
  }
  return pr;
}

Json run_reference(const ParamLayout& layout, const Partition& part, const Problem& pr, int world,
                   const OnebitStep& s, const OnebitConfig& c) {
  const auto live = live_ranges(layout);
  Json in = {{"world", world},
             {"steps", kSteps},
             {"betas", {s.beta1, s.beta2}},
             {"eps", s.eps},
             {"weight_decay", s.weight_decay},
             {"var_freeze_step", c.var_freeze_step},
             {"var_update_scaler", c.var_update_scaler},
             {"local_step_scaler", c.local_step_scaler},
             {"local_step_clipper", c.local_step_clipper},
             {"p0", pr.p0},
             {"grads", pr.grads}};
  for (int step = 1; step <= kSteps; ++step) in["lr"].push_back(lr_of(step));
  for (int u = 0; u < part.num_units(); ++u) {
    Json unit = {{"n", part.unit(u).shard}, {"live", Json::array()}, {"decay", Json::array()}};
    for (const auto& [b, e] : live[S(u)]) unit["live"].push_back(Json::array({b, e}));
    for (const DecayRange& d : part.decay_ranges(u))
      unit["decay"].push_back(Json::array({d.begin, d.end, d.decay ? 1 : 0}));
    in["units"].push_back(unit);
  }
  return test::run_python_reference("tests/unit/zero/zeroone_adam_reference.py", in);
}

OnebitStep hyper() {
  OnebitStep s;
  s.beta1 = 0.9;
  s.beta2 = 0.99;
  s.eps = 1e-8;
  s.weight_decay = 0.1;
  return s;
}

// Steps [from, to] on every rank: reduced steps get the sum of the ranks' gradients (grad_scale
// 1 / world, as the engine), the others each rank's own. Returns per step whether it reduced.
std::vector<bool> run_steps(std::vector<std::unique_ptr<OnebitOptimizer>>& opts,
                            std::vector<States>& ranks, const Problem& pr, int from, int to) {
  const int world = static_cast<int>(ranks.size());
  std::vector<bool> reduced;
  OnebitStep s = hyper();
  for (int step = from; step <= to; ++step) {
    s.step = step;
    s.lr = lr_of(step);
    const bool reduce = opts[0]->reduces_gradients(step);
    for (int r = 1; r < world; ++r) EXPECT_EQ(opts[S(r)]->reduces_gradients(step), reduce);
    reduced.push_back(reduce);
    const auto& g = pr.grads[S(step - 1)];
    for (int r = 0; r < world; ++r) {
      for (size_t u = 0; u < g[0].size(); ++u) {
        auto& dst = ranks[S(r)].g[u];
        dst = reduce ? g[0][u] : g[S(r)][u];
        if (reduce)
          for (int q = 1; q < world; ++q)
            for (size_t i = 0; i < dst.size(); ++i) dst[i] += g[S(q)][u][i];
      }
    }
    s.grad_scale = reduce ? 1.0f / static_cast<float>(world) : 1.0f;
    test::run_ranks(world, [&](int r) {
      if (reduce) {
        opts[S(r)]->warmup_step(ranks[S(r)].units(), s);
      } else {
        opts[S(r)]->compressed_step(ranks[S(r)].units(), s);
      }
    });
  }
  return reduced;
}

class ZeroOneAdamReference : public ::testing::TestWithParam<int> {};

TEST_P(ZeroOneAdamReference, MatchesDeepSpeedsStepInNumpy) {
  const int world = GetParam();
  const ParamLayout layout(small_spec());
  const Partition part(layout, 1);
  const OnebitConfig cfg = zeroone_config();
  const Problem pr = make_problem(part, live_ranges(layout), world);
  const Json ref = run_reference(layout, part, pr, world, hyper(), cfg);
  ASSERT_FALSE(HasFailure());

  auto w = test::make_world(world);
  std::vector<States> ranks(S(world), States(part));
  std::vector<std::unique_ptr<OnebitOptimizer>> opts;
  for (int r = 0; r < world; ++r) {
    ranks[S(r)].master = pr.p0;
    opts.push_back(std::make_unique<OnebitOptimizer>(OnebitKind::kZeroOneAdam, cfg, layout, part,
                                                     *w.comms[S(r)]));
  }
  const std::vector<bool> reduced = run_steps(opts, ranks, pr, 1, kSteps);
  // DeepSpeed's counter c = step + 1: variance steps at c = 2, 3, 4, 6 (the interval doubles
  // after 2 of them), compressed gradients at c = 5, 7; none after the freeze.
  const std::vector<bool> want_reduced = {true, true, true, false, true, false};
  for (int step = 1; step <= kSteps; ++step) {
    EXPECT_EQ(reduced[S(step - 1)], ref["reduced"][S(step - 1)].get<bool>()) << "step " << step;
    EXPECT_EQ(reduced[S(step - 1)], step <= 6 && want_reduced[S(step - 1)]) << "step " << step;
  }
  // Synchronisations after the freeze at c = 8, 9, 10, 12, 16, 20 (intervals 1, 1, 2, 2, 4, 4):
  // steps 7, 8, 9, 11, 15, 19; the last step (20) is local.
  std::vector<int> synced;
  for (int step = 1; step <= kSteps; ++step)
    if (ref["synced"][S(step - 1)].get<bool>()) synced.push_back(step);
  EXPECT_EQ(synced, (std::vector<int>{7, 8, 9, 11, 15, 19}));

  double worst = 0.0;
  for (int r = 0; r < world; ++r) {
    for (int u = 0; u < part.num_units(); ++u) {
      const std::vector<std::pair<const char*, const std::vector<float>*>> cmp = {
          {"p", &ranks[S(r)].master[S(u)]},
          {"m", &ranks[S(r)].m[S(u)]},
          {"v", &ranks[S(r)].v[S(u)]}};
      for (const auto& [what, mine] : cmp) {
        const std::vector<float> want = std::string(what) == "v"
                                            ? ref["v"][S(u)].get<std::vector<float>>()
                                            : ref[what][S(r)][S(u)].get<std::vector<float>>();
        ASSERT_EQ(want.size(), mine->size());
        double max_abs = 0.0;
        for (float x : want) max_abs = std::max(max_abs, std::fabs(static_cast<double>(x)));
        ASSERT_GT(max_abs, 0.0) << what << " unit " << u;
        for (size_t i = 0; i < want.size(); ++i) {
          const double err = std::fabs(static_cast<double>((*mine)[i]) - want[i]) / max_abs;
          worst = std::max(worst, err);
          ASSERT_LE(err, 1e-6) << what << " of rank " << r << " unit " << u << " element " << i;
        }
      }
    }
  }
  std::printf(
      "ZeroOneAdam vs DeepSpeed's step in numpy, world %d, 20 steps: worst error %.3g of "
      "the unit's max\n",
      world, worst);
  // After a local step the ranks' weights differ (each stepped with its own gradients).
  if (world > 1) {
    EXPECT_NE(ranks[0].master, ranks[1].master);
  }
}

INSTANTIATE_TEST_SUITE_P(World, ZeroOneAdamReference, ::testing::Values(1, 2));

TEST(ZeroOneAdam, StateBetweenSynchronisationsResumesBitwise) {
  const int world = 2, cut = 13;  // step 13: a local step (the next sync is at 15)
  const ParamLayout layout(small_spec());
  const Partition part(layout, 1);
  const OnebitConfig cfg = zeroone_config();
  const Problem pr = make_problem(part, live_ranges(layout), world);
  auto w = test::make_world(world);
  auto make = [&]() {
    std::vector<std::unique_ptr<OnebitOptimizer>> opts;
    for (int r = 0; r < world; ++r)
      opts.push_back(std::make_unique<OnebitOptimizer>(OnebitKind::kZeroOneAdam, cfg, layout, part,
                                                       *w.comms[S(r)]));
    return opts;
  };
  std::vector<States> whole(S(world), States(part));
  for (auto& r : whole) r.master = pr.p0;
  auto a = make();
  run_steps(a, whole, pr, 1, cut);
  ASSERT_NE(whole[0].master, whole[1].master);  // between synchronisations
  std::vector<std::string> files;
  for (int r = 0; r < world; ++r) {  // (what the checkpointer does)
    ASSERT_TRUE(a[S(r)]->keeps_rank_states());
    for (int u = 0; u < part.num_units(); ++u)
      a[S(r)]->capture_rank_states(u, 0, part.unit(u).shard, whole[S(r)].master[S(u)].data(),
                                   whole[S(r)].m[S(u)].data());
    files.push_back(a[S(r)]->serialize(cut));
  }
  run_steps(a, whole, pr, cut + 1, kSteps);

  // The same steps again up to the cut, then fresh optimizers on rank 0's weights, momentum and
  // variance (what a checkpoint's shards restore) read the rank files.
  std::vector<States> resumed(S(world), States(part));
  std::vector<States> replay(S(world), States(part));
  for (auto& r : replay) r.master = pr.p0;
  auto c = make();
  run_steps(c, replay, pr, 1, cut);
  for (int r = 0; r < world; ++r) {
    resumed[S(r)].master = replay[0].master;
    resumed[S(r)].m = replay[0].m;
    resumed[S(r)].v = replay[0].v;
  }
  auto b = make();
  for (int r = 0; r < world; ++r) {
    b[S(r)]->deserialize(files[S(r)], "rank file");
    ASSERT_TRUE(b[S(r)]->has_rank_states());
    for (int u = 0; u < part.num_units(); ++u)
      b[S(r)]->restore_rank_states(u, 0, part.unit(u).shard, resumed[S(r)].master[S(u)].data(),
                                   resumed[S(r)].m[S(u)].data());
  }
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(resumed[S(r)].master, replay[S(r)].master) << "rank " << r;
    EXPECT_EQ(resumed[S(r)].m, replay[S(r)].m) << "rank " << r;
  }
  run_steps(b, resumed, pr, cut + 1, kSteps);
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(resumed[S(r)].master, whole[S(r)].master) << "rank " << r;
    EXPECT_EQ(resumed[S(r)].m, whole[S(r)].m) << "rank " << r;
  }
  // A file of another kind is refused.
  OnebitOptimizer adam(OnebitKind::kAdam, cfg, layout, part, *w.comms[0]);
  EXPECT_THROW(adam.deserialize(files[0], "rank file"), InputError);
}

}  // namespace
}  // namespace zerod
