#include "zero/zero_engine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/rng.h"

namespace zerod {
namespace {

ModelSpec small_spec() {
  ModelSpec s;
  s.n_layer = 2;
  s.n_head = 2;
  s.n_embd = 20;
  s.vocab_size = 50;
  s.seq_len = 7;
  return s;
}

TEST(Partition, ShardsAreEqualPaddedAndCoverEveryUnit) {
  const ParamLayout layout(small_spec());
  for (int world : {1, 2, 3, 4, 7}) {
    const Partition p(layout, world);
    for (int u = 0; u < p.num_units(); ++u) {
      const UnitPartition& up = p.unit(u);
      EXPECT_EQ(up.padded % (16 * world), 0);
      EXPECT_GE(up.padded, up.numel);
      EXPECT_LT(up.padded - up.numel, 16 * world);
      EXPECT_EQ(up.shard * world, up.padded);
      int64_t valid = 0;
      for (int r = 0; r < world; ++r) valid += up.valid(r);
      EXPECT_EQ(valid, up.numel);
      // Decay ranges tile [0, padded) in order.
      int64_t cursor = 0;
      for (const DecayRange& d : p.decay_ranges(u)) {
        EXPECT_EQ(d.begin, cursor);
        EXPECT_LT(d.begin, d.end);
        cursor = d.end;
      }
      EXPECT_EQ(cursor, up.padded);
    }
  }
}

// Independent double-precision AdamW (DeepSpeed FusedAdam, decoupled decay).
void reference_adamw(double& p, double& m, double& v, double g, double lr, double b1, double b2,
                     double eps, double wd, int64_t step) {
  m = b1 * m + (1 - b1) * g;
  v = b2 * v + (1 - b2) * g * g;
  const double bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(b2, step);
  const double update = (m / bc1) / (std::sqrt(v) / std::sqrt(bc2) + eps) + wd * p;
  p -= lr * update;
}

struct EngineFixture {
  ParamLayout layout{small_spec()};
  std::unique_ptr<Backend> backend = make_cpu_backend(DType::kF32);
  MemoryTracker memory;
  ZeroEngine engine{layout, *backend, ZeroOptions{}, &memory};
  EngineFixture() { engine.init_weights(3); }
  void set_grads(uint64_t seed, float scale) {
    for (int u = 0; u < layout.num_units(); ++u) {
      const int64_t n = layout.unit(u).numel;
      float* g = static_cast<float*>(engine.grad_buffer(u));
      fill_normal(g, n, 0, scale, seed, u);
    }
  }
};

TEST(ZeroEngine, AdamWStepMatchesAReferenceWithDecayOnlyOn2DWeights) {
  EngineFixture f;
  const int u = 1;
  const UnitLayout& unit = f.layout.unit(u);
  std::vector<double> p(f.engine.master(u), f.engine.master(u) + unit.numel), m(unit.numel, 0),
      v(unit.numel, 0);
  OptimStep os;
  os.lr = 0.01;
  os.beta1 = 0.9;
  os.beta2 = 0.95;
  os.weight_decay = 0.1;
  os.loss_scale = 4.0;
  for (int step = 1; step <= 3; ++step) {
    f.set_grads(step, 4.0f);  // scaled by the loss scale 4
    const float* g = static_cast<const float*>(f.engine.grad_buffer(u));
    std::vector<double> gd(g, g + unit.numel);
    const StepResult r = f.engine.step(os);
    EXPECT_FALSE(r.overflow);
    EXPECT_EQ(r.clip_coef, 1.0);
    for (const TensorInfo& t : unit.tensors) {
      for (int64_t i = t.offset; i < t.offset + t.numel; ++i) {
        reference_adamw(p[i], m[i], v[i], gd[i] / 4.0, 0.01, 0.9, 0.95, 1e-8, t.decay ? 0.1 : 0.0,
                        step);
      }
    }
  }
  const float* master = f.engine.master(u);
  const float* w = static_cast<const float*>(f.engine.acquire(u));
  for (const TensorInfo& t : unit.tensors) {
    for (int64_t i = t.offset; i < t.offset + t.numel; ++i) {
      ASSERT_NEAR(master[i], p[i], 1e-6 + 1e-5 * std::abs(p[i]))
          << t.name << "[" << i - t.offset << "]";
      ASSERT_EQ(w[i], master[i]);  // fp32: compute weights are the master
    }
  }
  EXPECT_EQ(f.engine.adam_steps(), 3);
}

TEST(ZeroEngine, NormIsUnscaledAndClippingFollowsDeepSpeed) {
  EngineFixture f;
  f.set_grads(9, 8.0f);
  double sq = 0;
  for (int u = 0; u < f.layout.num_units(); ++u) {
    const float* g = static_cast<const float*>(f.engine.grad_buffer(u));
    for (int64_t i = 0; i < f.layout.unit(u).numel; ++i) sq += double{g[i]} * g[i];
  }
  const double norm = std::sqrt(sq) / 8.0;
  OptimStep os;
  os.loss_scale = 8.0;
  os.max_grad_norm = norm / 4;
  const StepResult r = f.engine.step(os);
  EXPECT_NEAR(r.grad_norm, norm, 1e-9 * norm);
  EXPECT_NEAR(r.clip_coef, (norm / 4) / (norm + 1e-6), 1e-12);
  os.max_grad_norm = norm * 2;  // above the norm: no clipping
  EXPECT_EQ(f.engine.step(os).clip_coef, 1.0);
}

TEST(ZeroEngine, OverflowSkipsTheStepAndLeavesEverythingUntouched) {
  EngineFixture f;
  f.set_grads(1, 1.0f);
  static_cast<float*>(f.engine.grad_buffer(2))[5] = std::numeric_limits<float>::infinity();
  const std::vector<float> before(f.engine.master(2), f.engine.master(2) + f.layout.unit(2).numel);
  const StepResult r = f.engine.step(OptimStep{});
  EXPECT_TRUE(r.overflow);
  EXPECT_EQ(f.engine.adam_steps(), 0);
  EXPECT_EQ(std::vector<float>(f.engine.master(2), f.engine.master(2) + f.layout.unit(2).numel),
            before);
  static_cast<float*>(f.engine.grad_buffer(2))[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(f.engine.step(OptimStep{}).overflow);
}

TEST(ZeroEngine, MemoryIsChargedPerCategory) {
  {
    EngineFixture f;  // fp32: the master is the compute weight itself
    int64_t padded = 0;
    for (int u = 0; u < f.layout.num_units(); ++u) padded += f.engine.partition().unit(u).padded;
    EXPECT_EQ(f.memory.current(MemCategory::kWeights), padded * 4);
    EXPECT_EQ(f.memory.current(MemCategory::kGradients), padded * 4);
    EXPECT_EQ(f.memory.current(MemCategory::kMaster), 0);
    EXPECT_EQ(f.memory.current(MemCategory::kMoments), padded * 8);
    EXPECT_EQ(f.engine.measured_bytes().states(),
              f.engine.formula_bytes().states() + (padded - f.layout.total_numel()) * 16);
  }
  {
    // bf16 (emulated in 4-byte storage): a separate fp32 master.
    const ParamLayout layout{small_spec()};
    auto backend = make_cpu_backend(DType::kBF16);
    MemoryTracker memory;
    ZeroEngine engine{layout, *backend, ZeroOptions{}, &memory};
    const int64_t padded = engine.partition().padded_elems_total();
    EXPECT_EQ(memory.current(MemCategory::kMaster), padded * 4);
    EXPECT_EQ(memory.current(MemCategory::kWeights), padded * 4);
  }
}

}  // namespace
}  // namespace zerod
