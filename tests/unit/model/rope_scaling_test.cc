// The rotary tables of the rope scalings that are not parity-tested channel by channel against
// transformers here (tests/hf/parity.py does that for the whole model): the limits where YaRN
// and dynamic NTK must reduce to the unscaled tables, and YaRN's attention factor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "model/llama.h"

namespace zerod {
namespace {

ModelSpec small_llama(int seq_len) {
  ModelSpec s;
  s.arch = ModelArch::kLlama;
  s.n_layer = 1;
  s.n_head = 2;
  s.n_embd = 32;  // HS 16: 8 frequencies
  s.intermediate_size = 48;
  s.vocab_size = 64;
  s.seq_len = seq_len;
  s.rope_theta = 100.0;
  return s;
}

struct Tables {
  std::vector<float> cos, sin;
};

Tables tables(const ModelSpec& s) {
  Tables t;
  rope_tables(s, &t.cos, &t.sin);
  return t;
}

TEST(RopeScaling, DynamicIsTheDefaultUpToMaxPositionsAndStretchesPastThem) {
  const ModelSpec plain = small_llama(16);
  ModelSpec dyn = plain;
  dyn.rope_scaling.type = RopeScaling::Type::kDynamic;
  dyn.rope_scaling.factor = 2.0;
  dyn.rope_scaling.max_position_embeddings = 16;
  EXPECT_EQ(tables(dyn).cos, tables(plain).cos);
  EXPECT_EQ(tables(dyn).sin, tables(plain).sin);
  // seq_len 32 > 16: base' = 100 (2 x 32/16 - 1)^(16/14). Channel 1's frequency is
  // base'^(-2/16); position 5's angle is 5 times it.
  ModelSpec longer = dyn;
  longer.seq_len = 32;
  const Tables t = tables(longer);
  const double base = 100.0 * std::pow(3.0, 16.0 / 14.0);
  const double angle = 5.0 * std::pow(base, -2.0 / 16.0);
  EXPECT_NEAR(t.cos[5 * 8 + 1], std::cos(angle), 1e-6);
  EXPECT_NEAR(t.sin[5 * 8 + 1], std::sin(angle), 1e-6);
  // Channel 0 (frequency 1) is not stretched by the base.
  EXPECT_NEAR(t.cos[5 * 8 + 0], std::cos(5.0), 1e-6);
}

TEST(RopeScaling, YarnWithFactorOneIsTheDefaultAndItsAttentionFactorScalesBothTables) {
  const ModelSpec plain = small_llama(16);
  ModelSpec yarn = plain;
  yarn.rope_scaling.type = RopeScaling::Type::kYarn;
  yarn.rope_scaling.factor = 1.0;
  yarn.rope_scaling.max_position_embeddings = 64;
  EXPECT_EQ(rope_attention_factor(yarn.rope_scaling), 1.0);
  {
    // Equal up to the rounding of interpolation x (1 - keep) + extrapolation x keep.
    const Tables y = tables(yarn), p = tables(plain);
    ASSERT_EQ(y.cos.size(), p.cos.size());
    for (size_t i = 0; i < y.cos.size(); ++i) {
      ASSERT_NEAR(y.cos[i], p.cos[i], 1e-6) << i;
      ASSERT_NEAR(y.sin[i], p.sin[i], 1e-6) << i;
    }
  }

  yarn.rope_scaling.factor = 4.0;
  const double af = 0.1 * std::log(4.0) + 1.0;
  EXPECT_DOUBLE_EQ(rope_attention_factor(yarn.rope_scaling), af);
  const Tables t = tables(yarn);
  EXPECT_FLOAT_EQ(t.cos[0], static_cast<float>(af));  // position 0: cos 1, sin 0
  EXPECT_FLOAT_EQ(t.sin[0], 0.0f);
  // The ramp (beta 32 and 1 over 64 positions, theta 100, 16 channels) runs from channel 0
  // to 5: channel 0 keeps its frequency, channels 5 and up are divided by the factor.
  const Tables p = tables(plain);
  for (int pos : {3, 11}) {
    const size_t row = static_cast<size_t>(pos) * 8;
    EXPECT_NEAR(t.cos[row + 0] / af, p.cos[row + 0], 1e-6);
    const double slow = pos * std::pow(100.0, -12.0 / 16.0) / 4.0;  // channel 6
    EXPECT_NEAR(t.cos[row + 6] / af, std::cos(slow), 1e-6);
    // Channel 2, inside the ramp, lies strictly between.
    const double f2 = std::pow(100.0, -4.0 / 16.0);
    const double a2 = std::acos(std::clamp(t.cos[row + 2] / af, -1.0, 1.0));
    EXPECT_GT(a2, pos * f2 / 4.0 + 1e-4);
    EXPECT_LT(a2, pos * f2 - 1e-4);
  }
  // An explicit attention_factor replaces the derived one.
  yarn.rope_scaling.attention_factor = 1.5;
  EXPECT_FLOAT_EQ(tables(yarn).cos[0], 1.5f);
}

}  // namespace
}  // namespace zerod
