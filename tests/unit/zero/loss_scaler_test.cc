// LossScaler on scripted overflow sequences; the expected scales are traced by hand from
// DeepSpeed's DynamicLossScaler.update_scale (see the comments next to each step).
#include "zero/loss_scaler.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"

namespace zerod {
namespace {

Fp16Config dynamic_fp16(int power, int64_t window, int hysteresis, bool consecutive,
                        double min_scale = 1.0) {
  Fp16Config c;
  c.enabled = true;
  c.loss_scale = 0.0;
  c.initial_scale_power = power;
  c.loss_scale_window = window;
  c.hysteresis = hysteresis;
  c.consecutive_hysteresis = consecutive;
  c.min_loss_scale = min_scale;
  return c;
}

struct Step {
  bool overflow;
  double scale_after;
};

void run_script(LossScaler& s, const std::vector<Step>& script) {
  for (size_t i = 0; i < script.size(); ++i) {
    EXPECT_EQ(s.update(script[i].overflow), script[i].overflow) << "step " << i;
    EXPECT_EQ(s.scale(), script[i].scale_after) << "step " << i;
  }
}

TEST(LossScaler, DisabledNeverScalesNorSkips) {
  LossScaler s(Fp16Config{});
  EXPECT_FALSE(s.enabled());
  EXPECT_FALSE(s.dynamic());
  EXPECT_EQ(s.scale(), 1.0);
  EXPECT_FALSE(s.update(true));
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 1.0);
}

TEST(LossScaler, StaticScaleSkipsOverflowsAndKeepsTheScale) {
  Fp16Config c;
  c.enabled = true;
  c.loss_scale = 128.0;
  LossScaler s(c);
  EXPECT_FALSE(s.dynamic());
  EXPECT_EQ(s.scale(), 128.0);
  run_script(s, {{true, 128}, {true, 128}, {false, 128}, {false, 128}});
}

TEST(LossScaler, WindowTwoHysteresisTwo) {
  LossScaler s(dynamic_fp16(/*power=*/4, /*window=*/2, /*hysteresis=*/2, /*consecutive=*/false));
  EXPECT_TRUE(s.dynamic());
  EXPECT_EQ(s.scale(), 16.0);
  run_script(s, {
                    {false, 16},  // iter 0: (0 - -1) % 2 = 1
                    {false, 32},  // iter 1: (1 - -1) % 2 = 0 -> x2, hysteresis refilled
                    {true, 32},   // iter 2: hysteresis 2 -> 1, scale kept
                    {true, 16},   // iter 3: hysteresis 1 -> /2
                    {false, 16},  // iter 4: (4 - 3) % 2 = 1
                    {false, 32},  // iter 5: (5 - 3) % 2 = 0 -> x2, hysteresis 2
                    {true, 32},   // iter 6: hysteresis 2 -> 1
                    {false, 32},  // iter 7: (7 - 6) % 2 = 1; hysteresis stays 1
                    {true, 16},   // iter 8: hysteresis 1 -> /2
                    {true, 8},    // iter 9: still 1 -> /2
                });
  const LossScaler::State st = s.state();
  EXPECT_EQ(st.iter, 10);
  EXPECT_EQ(st.last_overflow_iter, 9);
  EXPECT_EQ(st.hysteresis_left, 1);
}

TEST(LossScaler, ConsecutiveHysteresisRefillsAfterEveryGoodStep) {
  LossScaler s(dynamic_fp16(4, 2, 2, /*consecutive=*/true));
  run_script(s, {
                    {false, 16},  // iter 0
                    {false, 32},  // iter 1: x2
                    {true, 32},   // iter 2: hysteresis 2 -> 1
                    {true, 16},   // iter 3: /2
                    {false, 16},  // iter 4: hysteresis refilled to 2
                    {false, 32},  // iter 5: (5 - 3) % 2 = 0 -> x2
                    {true, 32},   // iter 6: 2 -> 1
                    {false, 32},  // iter 7: refilled to 2 (without consecutive it stays 1)
                    {true, 32},   // iter 8: 2 -> 1, scale kept
                    {true, 16},   // iter 9: /2
                });
}

TEST(LossScaler, HysteresisOneWindowOneDoublesEveryGoodStep) {
  LossScaler s(dynamic_fp16(3, 1, 1, false));
  run_script(s, {{false, 16}, {false, 32}, {true, 16}, {false, 32}, {true, 16}, {true, 8}});
}

TEST(LossScaler, MinimumScaleClampThenError) {
  // 4 / 2 = 2 is below the minimum 3: clamped to 3; another overflow at the minimum is fatal.
  LossScaler s(dynamic_fp16(2, 100, 1, false, /*min_scale=*/3.0));
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 3.0);
  EXPECT_EQ(s.update(false), false);
  EXPECT_EQ(s.scale(), 3.0);
  EXPECT_THROW(s.update(true), InputError);

  // Halving exactly onto the minimum, then the error.
  LossScaler t(dynamic_fp16(2, 100, 1, false, /*min_scale=*/1.0));
  run_script(t, {{true, 2}, {true, 1}});
  EXPECT_THROW(t.update(true), InputError);

  // With hysteresis left, an overflow at the minimum only spends budget.
  LossScaler u(dynamic_fp16(0, 100, 2, false, /*min_scale=*/1.0));
  EXPECT_TRUE(u.update(true));
  EXPECT_EQ(u.scale(), 1.0);
  EXPECT_THROW(u.update(true), InputError);
}

TEST(LossScaler, StateRestoresExactly) {
  const Fp16Config c = dynamic_fp16(10, 3, 2, false);
  const std::vector<bool> first = {false, true, false, false, true, true, false};
  const std::vector<bool> rest = {false, false, false, true, false, false, false, false};
  LossScaler a(c);
  for (bool o : first) a.update(o);
  LossScaler b(c);
  b.set_state(a.state());
  EXPECT_EQ(b.state(), a.state());
  for (bool o : rest) {
    EXPECT_EQ(a.update(o), b.update(o));
    EXPECT_EQ(a.state(), b.state());
  }
  LossScaler::State bad = a.state();
  bad.last_overflow_iter = bad.iter;  // an overflow cannot be recorded at a future iteration
  EXPECT_THROW(b.set_state(bad), Error);
}

}  // namespace
}  // namespace zerod
