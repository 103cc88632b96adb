// LR schedules against DeepSpeed's formulas, written out here step by step. lr(k) is the lr of
// the k-th optimizer step taken: k = 0 uses what the scheduler's constructor wrote, k >= 1 uses
// get_lr() at last_batch_iteration = k - 1.
#include "engine/train/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "core/error.h"

namespace zerod {
namespace {

constexpr double kTol = 1e-12;

OptimizerConfig adam(double lr, double beta1 = 0.9, double beta2 = 0.999) {
  OptimizerConfig o;
  o.lr = lr;
  o.beta1 = beta1;
  o.beta2 = beta2;
  return o;
}

TEST(LrSchedule, NoSchedulerUsesTheOptimizerLr) {
  const LrSchedule s(SchedulerConfig{}, adam(3e-4, 0.8, 0.95));
  for (int64_t k : {0, 1, 7, 100000}) {
    EXPECT_EQ(s.lr(k), 3e-4);
    EXPECT_EQ(s.beta1(k), 0.8);
    EXPECT_EQ(s.beta2(k), 0.95);
  }
  EXPECT_THROW(s.lr(-1), Error);
}

TEST(LrSchedule, WarmupLRLog) {
  SchedulerConfig c;
  c.type = SchedulerType::kWarmupLR;
  c.warmup_min_lr = 0.1;
  c.warmup_max_lr = 1.1;
  c.warmup_num_steps = 10;
  c.warmup_type = WarmupType::kLog;
  const LrSchedule s(c, adam(123.0));  // WarmupLR ignores the optimizer lr
  EXPECT_NEAR(s.lr(0), 0.1, kTol);     // constructor: min lr
  EXPECT_NEAR(s.lr(1), 0.1, kTol);     // last_batch_iteration 0: log(1) = 0
  EXPECT_NEAR(s.lr(2), 0.1 + std::log10(2.0), kTol);
  EXPECT_NEAR(s.lr(5), 0.1 + std::log10(5.0), kTol);
  EXPECT_NEAR(s.lr(10), 1.1, kTol);  // iteration 9: log(10) / log(10), the end of warmup
  EXPECT_NEAR(s.lr(11), 1.1, kTol);
  EXPECT_NEAR(s.lr(1000000), 1.1, kTol);
  EXPECT_EQ(s.beta1(5), 0.9);  // momentum untouched
}

TEST(LrSchedule, WarmupLRLinearAndMinimumOfTwoSteps) {
  SchedulerConfig c;
  c.type = SchedulerType::kWarmupLR;
  c.warmup_min_lr = 0.0;
  c.warmup_max_lr = 0.8;
  c.warmup_num_steps = 4;
  c.warmup_type = WarmupType::kLinear;
  const LrSchedule s(c, adam(1.0));
  const double want[] = {0.0, 0.0, 0.2, 0.4, 0.6, 0.8, 0.8, 0.8};  // it / 4 * 0.8 for it = k - 1
  for (int k = 0; k < 8; ++k) EXPECT_NEAR(s.lr(k), want[k], kTol) << k;

  // warmup_num_steps 0 and 1 are clamped to 2.
  for (int64_t n : {0, 1}) {
    c.warmup_num_steps = n;
    const LrSchedule t(c, adam(1.0));
    EXPECT_NEAR(t.lr(1), 0.0, kTol);
    EXPECT_NEAR(t.lr(2), 0.4, kTol);
    EXPECT_NEAR(t.lr(3), 0.8, kTol);
  }
}

TEST(LrSchedule, WarmupDecayLR) {
  SchedulerConfig c;
  c.type = SchedulerType::kWarmupDecayLR;
  c.warmup_min_lr = 0.0;
  c.warmup_max_lr = 1.0;
  c.warmup_num_steps = 4;
  c.warmup_type = WarmupType::kLinear;
  c.total_num_steps = 10;
  const LrSchedule s(c, adam(5.0));
  EXPECT_NEAR(s.lr(0), 0.0, kTol);
  EXPECT_NEAR(s.lr(1), 0.0, kTol);
  EXPECT_NEAR(s.lr(4), 0.75, kTol);       // iteration 3: 3/4
  EXPECT_NEAR(s.lr(5), 1.0, kTol);        // iteration 4: (10 - 4) / (10 - 4)
  EXPECT_NEAR(s.lr(6), 5.0 / 6.0, kTol);  // (10 - 5) / 6
  EXPECT_NEAR(s.lr(10), 1.0 / 6.0, kTol);
  EXPECT_NEAR(s.lr(11), 0.0, kTol);  // iteration 10 = total
  EXPECT_NEAR(s.lr(12), 0.0, kTol);  // past the total: clamped at 0
  EXPECT_NEAR(s.lr(500), 0.0, kTol);

  // total < warmup: the decay length is max(1, total - warmup) = 1.
  c.total_num_steps = 3;
  const LrSchedule short_total(c, adam(5.0));
  EXPECT_NEAR(short_total.lr(4), 0.75, kTol);
  EXPECT_NEAR(short_total.lr(5), 0.0, kTol);
}

TEST(LrSchedule, WarmupCosineLRIsARatioOfTheOptimizerLr) {
  SchedulerConfig c;
  c.type = SchedulerType::kWarmupCosineLR;
  c.warmup_min_ratio = 0.2;
  c.cos_min_ratio = 0.1;
  c.warmup_num_steps = 4;
  c.warmup_type = WarmupType::kLinear;
  c.total_num_steps = 12;
  const double lr = 0.5;
  const LrSchedule s(c, adam(lr));
  const double pi = std::numbers::pi;
  auto cosine = [&](double real_last) {  // after warmup, real_total = 12 - 4 = 8
    return lr * (0.1 + 0.9 * (1 + std::cos(pi * real_last / 8.0)) / 2);
  };
  EXPECT_EQ(s.lr(0), 0.0);                             // the constructor writes 0
  EXPECT_NEAR(s.lr(1), lr * 0.2, kTol);                // iteration 0: warmup_min_ratio
  EXPECT_NEAR(s.lr(3), lr * (0.2 + 0.5 * 0.8), kTol);  // iteration 2: 2/4 of the way
  EXPECT_NEAR(s.lr(4), lr * (0.2 + 0.75 * 0.8), kTol);
  EXPECT_NEAR(s.lr(5), cosine(1), kTol);  // iteration 4 = warmup end
  EXPECT_NEAR(s.lr(8), cosine(4), kTol);
  EXPECT_NEAR(s.lr(12), lr * 0.1, kTol);  // iteration 11: cos(pi), the total's end
  // Past the total DeepSpeed's cosine rises again (it does not clamp).
  EXPECT_NEAR(s.lr(13), cosine(9), kTol);
  EXPECT_GT(s.lr(13), s.lr(12));
  EXPECT_NEAR(s.lr(20), lr, kTol);  // cos(2 pi)

  c.warmup_type = WarmupType::kLog;
  c.warmup_num_steps = 10;
  c.total_num_steps = 100;
  const LrSchedule log_warmup(c, adam(lr));
  EXPECT_NEAR(log_warmup.lr(2), lr * (0.2 + std::log10(2.0) * 0.8), kTol);
  EXPECT_NEAR(log_warmup.lr(10), lr, kTol);  // iteration 9: ratio 1
}

SchedulerConfig one_cycle() {
  SchedulerConfig c;
  c.type = SchedulerType::kOneCycle;
  c.cycle_min_lr = 0.1;
  c.cycle_max_lr = 1.1;
  c.cycle_first_step_size = 4;
  c.cycle_second_step_size = 6;  // cycle of 10, rising for 40% of it
  c.decay_step_size = 2;
  c.decay_lr_rate = 0.5;
  c.cycle_momentum = true;
  c.cycle_min_mom = 0.8;
  c.cycle_max_mom = 0.9;
  c.decay_mom_rate = 0.1;
  return c;
}

TEST(LrSchedule, OneCycleLrAndMomentum) {
  const LrSchedule s(one_cycle(), adam(7.0, 0.5, 0.5));
  // The constructor: cycle_min_lr and betas (cycle_min_mom, 0.99).
  EXPECT_NEAR(s.lr(0), 0.1, kTol);
  EXPECT_NEAR(s.beta1(0), 0.8, kTol);
  EXPECT_EQ(s.beta2(0), 0.99);
  // k >= 1: x = k / 10 inside the cycle; rising while x <= 0.4, scale x / 0.4, then falling,
  // scale (x - 1) / (0.4 - 1). lr = min + 1.0 * scale, momentum = 0.9 - 0.1 * scale.
  struct Want {
    int k;
    double scale;
  };
  for (const Want w : {Want{1, 0.25}, Want{2, 0.5}, Want{4, 1.0}, Want{5, 0.5 / 0.6},
                       Want{7, 0.3 / 0.6}, Want{9, 0.1 / 0.6}, Want{10, 0.0}}) {
    EXPECT_NEAR(s.lr(w.k), 0.1 + w.scale, kTol) << w.k;
    EXPECT_NEAR(s.beta1(w.k), 0.9 - 0.1 * w.scale, kTol) << w.k;
    EXPECT_EQ(s.beta2(w.k), 0.99);
  }
  // After the cycle (iteration >= 10): decay over decay_iteration = iteration - 10 + 1,
  // lr = min / (1 + 0.5 * d / 2), momentum = max * (1 + 0.1 * d / 2).
  for (int k : {11, 12, 15, 40}) {
    const double d = (k - 1) - 10 + 1;
    EXPECT_NEAR(s.lr(k), 0.1 / (1 + 0.5 * d / 2), kTol) << k;
    EXPECT_NEAR(s.beta1(k), 0.9 * (1 + 0.1 * d / 2), kTol) << k;
  }
}

TEST(LrSchedule, OneCycleWithoutDecayOrMomentum) {
  SchedulerConfig c = one_cycle();
  c.decay_step_size = 0;  // no decay: min lr and max momentum after the cycle
  const LrSchedule s(c, adam(7.0));
  EXPECT_NEAR(s.lr(11), 0.1, kTol);
  EXPECT_NEAR(s.lr(1000), 0.1, kTol);
  EXPECT_NEAR(s.beta1(1000), 0.9, kTol);

  c = one_cycle();
  c.decay_lr_rate = 0.0;  // a zero rate also skips the lr decay; momentum still decays
  const LrSchedule no_lr_decay(c, adam(7.0));
  EXPECT_NEAR(no_lr_decay.lr(15), 0.1, kTol);
  EXPECT_NEAR(no_lr_decay.beta1(15), 0.9 * (1 + 0.1 * 5 / 2.0), kTol);

  c = one_cycle();
  c.cycle_momentum = false;  // betas stay the optimizer's
  const LrSchedule no_mom(c, adam(7.0, 0.7, 0.98));
  for (int k : {0, 1, 5, 20}) {
    EXPECT_EQ(no_mom.beta1(k), 0.7);
    EXPECT_EQ(no_mom.beta2(k), 0.98);
  }
  EXPECT_NEAR(no_mom.lr(1), 0.35, kTol);
}

TEST(LrSchedule, OneCycleSecondSizeDefaultsToFirstAndStairsAreUnused) {
  SchedulerConfig c = one_cycle();
  c.cycle_second_step_size.reset();  // symmetric cycle of 8
  const LrSchedule s(c, adam(1.0));
  EXPECT_NEAR(s.lr(2), 0.1 + 0.5, kTol);  // x = 2/8, scale 0.25 / 0.5
  EXPECT_NEAR(s.lr(4), 1.1, kTol);
  EXPECT_NEAR(s.lr(6), 0.1 + 0.5, kTol);  // x = 6/8, scale (0.75 - 1) / (0.5 - 1)
  // DeepSpeed stores the stair counts but never reads them.
  c.cycle_first_stair_count = 2;
  c.cycle_second_stair_count = 3;
  const LrSchedule stairs(c, adam(1.0));
  for (int k = 0; k < 20; ++k) EXPECT_EQ(stairs.lr(k), s.lr(k)) << k;
}

}  // namespace
}  // namespace zerod
