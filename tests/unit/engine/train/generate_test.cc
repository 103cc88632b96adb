// The token choice of `zerod generate`: greedy, temperature, top-k and top-p as transformers
// applies them.
#include "engine/train/generate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace zerod {
namespace {

GenerateOptions sampling(double temperature, int top_k = 0, double top_p = 1.0) {
  GenerateOptions o;
  o.temperature = temperature;
  o.top_k = top_k;
  o.top_p = top_p;
  return o;
}

TEST(PickToken, GreedyIsTheArgmaxWhateverTheDraw) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 1.9f};
  for (double u : {0.0, 0.5, 0.999}) EXPECT_EQ(pick_token(logits.data(), 4, {}, u), 1);
}

TEST(PickToken, SamplesTheTemperedDistribution) {
  // Probabilities 0.75 (token 1) and 0.25 (token 0) at temperature 1: the draw u picks token 1
  // below 0.75 and token 0 above.
  const std::vector<float> logits = {0.0f, std::log(3.0f)};
  EXPECT_EQ(pick_token(logits.data(), 2, sampling(1.0), 0.70), 1);
  EXPECT_EQ(pick_token(logits.data(), 2, sampling(1.0), 0.80), 0);
  // Temperature 0.5 squares the odds: 9:1, so 0.8 stays on token 1.
  EXPECT_EQ(pick_token(logits.data(), 2, sampling(0.5), 0.80), 1);
  EXPECT_EQ(pick_token(logits.data(), 2, sampling(0.5), 0.95), 0);
}

TEST(PickToken, TopKAndTopPKeepTheMostLikelyTokens) {
  const std::vector<float> logits = {0.0f, std::log(3.0f), std::log(2.0f), -5.0f};
  // top-k 1: always the argmax.
  for (double u : {0.0, 0.5, 0.999}) EXPECT_EQ(pick_token(logits.data(), 4, sampling(1, 1), u), 1);
  // Probabilities 0.499 (token 1), 0.333 (2), 0.166 (0), 0.001 (3): top-p 0.4 keeps token 1
  // alone.
  for (double u : {0.0, 0.9}) EXPECT_EQ(pick_token(logits.data(), 4, sampling(1, 0, 0.4), u), 1);
  // top-p 0.6 keeps tokens 1 and 2 (renormalised 0.6 / 0.4): u 0.7 picks token 2, never 0.
  EXPECT_EQ(pick_token(logits.data(), 4, sampling(1, 0, 0.6), 0.5), 1);
  EXPECT_EQ(pick_token(logits.data(), 4, sampling(1, 0, 0.6), 0.7), 2);
  EXPECT_EQ(pick_token(logits.data(), 4, sampling(1, 0, 0.6), 0.999), 2);
}

}  // namespace
}  // namespace zerod
