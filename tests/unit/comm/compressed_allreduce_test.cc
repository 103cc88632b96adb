// The 1-bit compressed all-reduce (comm/compressed_allreduce.h) at world 2 and 4 over Gloo:
// bitwise equal to a plain one-process reference of the same algorithm (unpacked signs, every
// rank's errors side by side), round after round; and error feedback: the average of the
// compressed results over many rounds of the same inputs converges to the true mean.
#include "comm/compressed_allreduce.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "comm/collective_log.h"
#include "core/rng.h"
#include "tests/unit/comm/comm_test_util.h"
#include "tests/unit/comm/compressed_reference.h"

namespace zerod {
namespace {

using test::make_world;
using test::run_ranks;
using test::S;

std::vector<float> random_tensor(int rank, int round, int64_t n) {
  Rng rng(1000 * static_cast<uint64_t>(rank) + static_cast<uint64_t>(round) + 7);
  std::vector<float> x(S(n));
  // Mixed magnitudes, exact zeros and negative zeros (sign +1 in DeepSpeed's convention).
  for (int64_t i = 0; i < n; ++i) {
    float v = static_cast<float>(rng.uniform01() * 2 - 1) * (i % 3 == 0 ? 5.0f : 0.5f);
    if (i % 17 == 0) v = 0.0f;
    if (i % 19 == 0) v = -0.0f;
    x[S(i)] = v;
  }
  return x;
}

using test::CompressedReference;

TEST(CompressedAllReduce, PaddingMakesWholeBytesPerChunk) {
  EXPECT_EQ(CompressedAllReduce::padded_elems(1, 1), 8);
  EXPECT_EQ(CompressedAllReduce::padded_elems(16, 2), 16);
  EXPECT_EQ(CompressedAllReduce::padded_elems(17, 2), 32);
  EXPECT_EQ(CompressedAllReduce::padded_elems(100, 4), 128);  // 4 chunks of 32 (lcm(4, 8) = 8)
  EXPECT_EQ(CompressedAllReduce::padded_elems(100, 3), 144);  // 3 x 48 (lcm(3, 8) = 24)
}

TEST(CompressedAllReduce, SignsPackMostSignificantBitFirst) {
  const float y[8] = {1.0f, -1.0f, 0.0f, -0.0f, -2.0f, 3.0f, -0.5f, 0.5f};
  uint8_t b = 0;
  pack_signs(y, 8, &b);
  EXPECT_EQ(b, 0b10110101);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(unpacked_sign(&b, i), y[i] < 0 ? -1.0f : 1.0f) << i;
}

class CompressedAllReduceWorld : public ::testing::TestWithParam<int> {};

// Five rounds (the errors carry over), n not a multiple of the chunking: every rank's result
// and errors equal the reference's bit for bit, and all ranks agree.
TEST_P(CompressedAllReduceWorld, MatchesThePlainReferenceBitwise) {
  const int world = GetParam();
  const int64_t n = 1001;
  auto w = make_world(world);
  CompressedReference ref(world, n);
  const int64_t P = ref.P, C = ref.C;
  std::vector<std::vector<float>> worker(S(world), std::vector<float>(S(P), 0.0f));
  std::vector<std::vector<float>> server(S(world), std::vector<float>(S(C), 0.0f));
  for (int round = 0; round < 5; ++round) {
    std::vector<std::vector<float>> x, got(S(world));
    for (int r = 0; r < world; ++r) x.push_back(random_tensor(r, round, n));
    const std::vector<float> want = ref.run(x);
    run_ranks(world, [&](int r) {
      CompressedAllReduce car(*w.comms[S(r)]);
      got[S(r)] = x[S(r)];
      car.run(got[S(r)].data(), n, worker[S(r)].data(), server[S(r)].data());
    });
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(got[S(r)], want) << "rank " << r << " round " << round;
      ASSERT_EQ(worker[S(r)], ref.worker[S(r)]) << "rank " << r;
      ASSERT_EQ(server[S(r)], ref.server[S(r)]) << "rank " << r;
    }
  }
  // The collectives: one all-to-all and one all-gather per call, of world records each.
  const auto totals = w.comms[0]->collective_log()->totals();
  const int64_t record = C / 8 + 4;
  EXPECT_EQ(totals.at("all_to_all").calls, 5);
  EXPECT_EQ(totals.at("all_to_all").bytes, 5 * world * record);
  EXPECT_EQ(totals.at("all_gather").bytes, 5 * world * record);
  EXPECT_EQ(totals.count("all_reduce"), 0u);
}

// Error feedback: the same inputs, round after round. One round's result is off by about the
// inputs' size; the running average of the results approaches the true mean like 1/rounds.
TEST_P(CompressedAllReduceWorld, ErrorFeedbackMakesTheAverageConverge) {
  const int world = GetParam();
  const int64_t n = 512;
  auto w = make_world(world);
  std::vector<std::vector<float>> x;
  for (int r = 0; r < world; ++r) x.push_back(random_tensor(r, 0, n));
  std::vector<double> mean(S(n), 0.0);
  for (int r = 0; r < world; ++r)
    for (int64_t i = 0; i < n; ++i) mean[S(i)] += x[S(r)][S(i)] / world;
  const int64_t P = CompressedAllReduce::padded_elems(n, world);
  std::vector<double> first_err(1), avg_err(1);
  run_ranks(world, [&](int r) {
    CompressedAllReduce car(*w.comms[S(r)]);
    std::vector<float> we(S(P), 0.0f), se(S(P / world), 0.0f);
    std::vector<double> sum(S(n), 0.0);
    const int rounds = 150;
    auto err = [&](const std::vector<double>& v, double k) {
      double e = 0, m = 0;
      for (int64_t i = 0; i < n; ++i) {
        e += std::pow(v[S(i)] / k - mean[S(i)], 2);
        m += std::pow(mean[S(i)], 2);
      }
      return std::sqrt(e / m);  // relative L2 error
    };
    for (int k = 1; k <= rounds; ++k) {
      std::vector<float> y = x[S(r)];
      car.run(y.data(), n, we.data(), se.data());
      for (int64_t i = 0; i < n; ++i) sum[S(i)] += y[S(i)];
      if (k == 1 && r == 0) first_err[0] = err(sum, 1);
    }
    if (r == 0) avg_err[0] = err(sum, rounds);
  });
  EXPECT_GT(first_err[0], 0.3);  // one round of 1-bit compression is far off
  EXPECT_LT(avg_err[0], 0.05) << "first round " << first_err[0];  // the errors fed back cancel
  std::printf("relative error: one round %.3f, average of 150 rounds %.4f\n", first_err[0],
              avg_err[0]);
}

INSTANTIATE_TEST_SUITE_P(Worlds, CompressedAllReduceWorld, ::testing::Values(2, 4));

}  // namespace
}  // namespace zerod
