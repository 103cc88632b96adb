// OneBitLamb (zero/onebit.h, zero/onebit_lamb.cc):
//  - at world 1 (no compression, as DeepSpeed at size 1), 10 steps with the freeze at step 4
//    against DeepSpeed's OnebitLamb.step in torch ops (tests/unit/zero/onebit_lamb_reference.py):
//    weights and momentum within 1e-6 relative on every tensor of a small GPT-2's units;
//  - on two ranks (threads over Gloo), two warm-up steps on all-reduced gradients and three
//    compressed steps on each rank's own gradients against a one-process reference of the same
//    algorithm (the plain compressed all-reduce reference, the scaling, the mask, the fresh
//    variance and the factor's clamps), bitwise on both ranks;
//  - the rank-independent state round-trips through serialize_shared (a resumed optimizer
//    continues bitwise) and a file of another model is refused.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
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

// A tensor's live elements [begin, end) of its unit (the padded vocabulary rows left out).
struct Live {
  int unit;
  int64_t begin, end;
  bool decay;
};
std::vector<Live> live_tensors(const ParamLayout& layout) {
  std::vector<Live> out;
  for (int u = 0; u < layout.num_units(); ++u) {
    for (const TensorInfo& t : layout.unit(u).tensors) {
      const int64_t rows = t.real_rows >= 0 ? t.real_rows : t.shape[0];
      out.push_back({u, t.offset, t.offset + t.numel / t.shape[0] * rows, t.decay});
    }
  }
  return out;
}

OnebitConfig lamb_config(int64_t freeze_step) {
  OnebitConfig c;
  c.freeze_step = freeze_step;
  c.max_coeff = 10.0;
  c.min_coeff = 0.01;
  c.coeff_beta = 0.9;
  c.factor_max = 4.0;
  c.factor_min = 0.5;
  c.factor_threshold = 0.1;
  return c;
}

// Per unit: master, m, v, gradients (host fp32, the unit's shard = whole unit at stage 0).
struct States {
  std::vector<std::vector<float>> master, m, v, g;
  std::vector<OnebitUnit> units(const Partition& part) {
    std::vector<OnebitUnit> us;
    for (size_t u = 0; u < master.size(); ++u)
      us.push_back({master[u].data(), m[u].data(), v[u].data(), g[u].data(),
                    part.unit(static_cast<int>(u)).shard});
    return us;
  }
  explicit States(const Partition& part) {
    for (int u = 0; u < part.num_units(); ++u) {
      for (auto* x : {&master, &m, &v, &g}) x->emplace_back(S(part.unit(u).shard), 0.0f);
    }
  }
};

TEST(OnebitLamb, MatchesDeepSpeedsOnebitLambInTorchAtWorld1) {
  const ParamLayout layout(small_spec());
  const Partition part(layout, 1);
  const std::vector<Live> tensors = live_tensors(layout);
  const int freeze = 4, steps = 10;
  OnebitStep s;
  s.lr = 1e-2;
  s.beta1 = 0.9;
  s.beta2 = 0.999;
  s.eps = 1e-8;
  s.weight_decay = 0.1;
  const OnebitConfig cfg = lamb_config(freeze);
  Json in = {{"seed", 7},
             {"freeze_step", freeze},
             {"steps", steps},
             {"lr", s.lr},
             {"betas", {s.beta1, s.beta2}},
             {"eps", s.eps},
             {"weight_decay", s.weight_decay},
             {"max_coeff", cfg.max_coeff},
             {"min_coeff", cfg.min_coeff},
             {"coeff_beta", cfg.coeff_beta},
             {"factor_max", cfg.factor_max},
             {"factor_min", cfg.factor_min},
             {"factor_threshold", cfg.factor_threshold}};
  for (const Live& t : tensors) {
    in["sizes"].push_back(t.end - t.begin);
    in["decay"].push_back(t.decay);
  }
  const Json ref = test::run_python_reference("tests/unit/zero/onebit_lamb_reference.py", in);
  ASSERT_FALSE(HasFailure());

  States st(part);
  auto scatter = [&](const Json& per_tensor, std::vector<std::vector<float>>& dst) {
    for (size_t k = 0; k < tensors.size(); ++k) {
      const std::vector<float> x = per_tensor[k].get<std::vector<float>>();
      std::copy(x.begin(), x.end(), dst[S(tensors[k].unit)].begin() + tensors[k].begin);
    }
  };
  scatter(ref["p0"], st.master);
  auto w = test::make_world(1);
  OnebitOptimizer opt(OnebitKind::kLamb, cfg, layout, part, *w.comms[0]);
  for (int step = 1; step <= steps; ++step) {
    scatter(ref["grads"][S(step - 1)], st.g);
    s.step = step;
    if (opt.reduces_gradients(step)) {
      opt.warmup_step(st.units(part), s);
    } else {
      opt.compressed_step(st.units(part), s);
    }
  }
  double worst = 0.0;
  for (size_t k = 0; k < tensors.size(); ++k) {
    const Live& t = tensors[k];
    for (const auto& [what, mine] : {std::pair{"p", &st.master}, std::pair{"m", &st.m}}) {
      const std::vector<float> want = ref[what][k].get<std::vector<float>>();
      double max_abs = 0.0;
      for (float x : want) max_abs = std::max(max_abs, std::fabs(static_cast<double>(x)));
      for (int64_t i = 0; i < t.end - t.begin; ++i) {
        const double err =
            std::fabs(static_cast<double>((*mine)[S(t.unit)][S(t.begin + i)]) - want[S(i)]) /
            max_abs;
        worst = std::max(worst, err);
        ASSERT_LE(err, 1e-6) << what << " of tensor " << k << " element " << i;
      }
    }
  }
  std::printf("OneBitLamb vs torch, 10 steps (freeze 4): worst error %.3g of the tensor's max\n",
              worst);
  // The weights moved in the compressed steps (the frozen coefficients are not 0).
  EXPECT_GT(ref["coeff_freeze"][0].get<double>(), 0.0);
}

// The one-process reference of a compressed step on every rank (the same algorithm on plain
// vectors; compressed_reference.h for the all-reduce).
struct LambReference {
  std::vector<Live> tensors;
  std::vector<double> coeff_freeze, last_factor, scaling;
  std::vector<std::vector<float>> fresh;  // per unit
  bool frozen = false;
};

double norm(const std::vector<float>& x) {
  double ss = 0;
  for (float v : x) ss += static_cast<double>(v) * v;
  return std::sqrt(ss);
}

void reference_step(LambReference& ref, std::vector<States>& ranks,
                    std::vector<test::CompressedReference>& car, const Partition& part,
                    const OnebitConfig& c, const OnebitStep& s) {
  const int world = static_cast<int>(ranks.size());
  const float b1 = static_cast<float>(s.beta1), b2 = static_cast<float>(s.beta2);
  const float omb1 = static_cast<float>(1.0 - s.beta1), omb2 = static_cast<float>(1.0 - s.beta2);
  const float eps = static_cast<float>(s.eps);
  if (!ref.frozen) {
    std::vector<double> rms;
    for (const Live& t : ref.tensors) {
      double ss = 0;
      for (int64_t i = t.begin; i < t.end; ++i) {
        const double x = ranks[0].m[S(t.unit)][S(i)];
        ss += x * x;
      }
      rms.push_back(std::sqrt(ss) / std::sqrt(static_cast<double>(t.end - t.begin)));
    }
    double mean = 0;
    for (double x : rms) mean += x;
    mean /= static_cast<double>(rms.size());
    for (double x : rms) ref.scaling.push_back(mean / x);
    ref.fresh = ranks[0].v;
    ref.frozen = true;
  }
  const std::vector<std::vector<float>> last = ranks[0].m;
  for (int u = 0; u < part.num_units(); ++u) {
    std::vector<std::vector<float>> ms;
    for (int r = 0; r < world; ++r) {
      std::vector<float> m = ranks[S(r)].m[S(u)];
      for (size_t k = 0; k < ref.tensors.size(); ++k) {
        const Live& t = ref.tensors[k];
        if (t.unit != u) continue;
        for (int64_t i = t.begin; i < t.end; ++i) {
          const float g = ranks[S(r)].g[S(u)][S(i)] * s.grad_scale;
          m[S(i)] = (m[S(i)] * b1 + omb1 * g) * static_cast<float>(ref.scaling[k]);
        }
      }
      ms.push_back(std::move(m));
    }
    const std::vector<float> avg = car[S(u)].run(ms);
    std::vector<float> m(avg.size(), 0.0f);  // the mask: 0 outside the live tensors
    for (size_t k = 0; k < ref.tensors.size(); ++k) {
      const Live& t = ref.tensors[k];
      if (t.unit != u) continue;
      for (int64_t i = t.begin; i < t.end; ++i)
        m[S(i)] = avg[S(i)] / static_cast<float>(ref.scaling[k]);
    }
    std::vector<float> p = ranks[0].master[S(u)];
    for (size_t k = 0; k < ref.tensors.size(); ++k) {
      const Live& t = ref.tensors[k];
      if (t.unit != u) continue;
      const float wd = t.decay ? static_cast<float>(s.weight_decay) : 0.0f;
      std::vector<float> d, prelim, update;
      float factor = 0.0f;
      for (int64_t i = t.begin; i < t.end; ++i) {
        const float g = (m[S(i)] - last[S(u)][S(i)] * b1) / omb1;
        float& f = ref.fresh[S(u)][S(i)];
        f = f * b2 + omb2 * g * g;
        d.push_back(std::sqrt(ranks[0].v[S(u)][S(i)]) + eps);
        prelim.push_back(m[S(i)] / d.back());
        update.push_back(wd > 0.0f ? prelim.back() + wd * p[S(i)] : prelim.back());
        factor = std::max(factor, d.back() / (std::sqrt(f) + eps));
      }
      double f = factor;
      if (wd > 0.0f) {
        const double q = std::min(1.0, norm(prelim) / norm(update));
        f = f * q + (1.0 - q);
      }
      f = std::min(std::max(f, c.factor_min), c.factor_max);
      f = std::min(std::max(f, ref.last_factor[k] * (1 - c.factor_threshold)),
                   ref.last_factor[k] * (1 + c.factor_threshold));
      ref.last_factor[k] = f;
      const float step = static_cast<float>(-s.lr * (ref.coeff_freeze[k] * f));
      for (int64_t i = t.begin; i < t.end; ++i) p[S(i)] += step * update[S(i - t.begin)];
    }
    for (int r = 0; r < world; ++r) {
      ranks[S(r)].m[S(u)] = m;
      ranks[S(r)].master[S(u)] = p;
    }
  }
}

TEST(OnebitLamb, TwoRanksMatchAOneProcessReference) {
  const int world = 2, freeze = 2, steps = 5;
  const ParamLayout layout(small_spec());
  const Partition part(layout, 1);
  const OnebitConfig cfg = lamb_config(freeze);
  OnebitStep s;
  s.lr = 1e-2;
  s.beta1 = 0.9;
  s.beta2 = 0.99;
  s.weight_decay = 0.1;
  s.eps = 1e-8;
  std::vector<States> ranks(S(world), States(part));
  Rng init(3);
  for (auto& unit : ranks[0].master)
    for (float& x : unit) x = static_cast<float>(init.uniform01()) - 0.5f;
  ranks[1].master = ranks[0].master;
  auto w = test::make_world(world);
  std::vector<std::unique_ptr<OnebitOptimizer>> opts;
  for (int r = 0; r < world; ++r)
    opts.push_back(
        std::make_unique<OnebitOptimizer>(OnebitKind::kLamb, cfg, layout, part, *w.comms[S(r)]));
  std::vector<States> want;
  LambReference ref;
  ref.tensors = live_tensors(layout);
  std::vector<test::CompressedReference> car;
  for (int u = 0; u < part.num_units(); ++u) car.emplace_back(world, part.unit(u).shard);
  for (int step = 1; step <= steps; ++step) {
    s.step = step;
    Rng rng(100 + step);
    for (int r = 0; r < world; ++r)
      for (auto& unit : ranks[S(r)].g)
        for (float& x : unit) x = 4.0f * (static_cast<float>(rng.uniform01()) - 0.5f);
    if (step <= freeze) {
      // The all-reduced gradients (the sum; grad_scale halves it) on both ranks.
      for (size_t u = 0; u < ranks[0].g.size(); ++u)
        for (size_t i = 0; i < ranks[0].g[u].size(); ++i)
          ranks[0].g[u][i] = ranks[1].g[u][i] = ranks[0].g[u][i] + ranks[1].g[u][i];
      s.grad_scale = 0.5f;
      test::run_ranks(world, [&](int r) { opts[S(r)]->warmup_step(ranks[S(r)].units(part), s); });
      ASSERT_EQ(ranks[0].master, ranks[1].master);
      if (step == freeze) {
        // The reference starts from the optimizer's warm-up (checked against torch above) and
        // its frozen coefficients, read back from its state file.
        want = ranks;
        for (const auto& unit : opts[0]->lamb_coeff_freeze())
          ref.coeff_freeze.insert(ref.coeff_freeze.end(), unit.begin(), unit.end());
        ref.last_factor.assign(ref.coeff_freeze.size(), 1.0);
        ASSERT_GT(ref.coeff_freeze[0], 0.0);
      }
      continue;
    }
    s.grad_scale = 0.25f;
    for (int r = 0; r < world; ++r) want[S(r)].g = ranks[S(r)].g;
    reference_step(ref, want, car, part, cfg, s);
    test::run_ranks(world, [&](int r) { opts[S(r)]->compressed_step(ranks[S(r)].units(part), s); });
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(ranks[S(r)].m, want[S(r)].m) << "rank " << r << " step " << step;
      ASSERT_EQ(ranks[S(r)].master, want[S(r)].master) << "rank " << r << " step " << step;
    }
  }
}

}  // namespace
}  // namespace zerod
