// Sampler: deterministic, seed-dependent, every epoch a permutation, random access = sequential.
#include "engine/data/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

namespace zerod {
namespace {

std::vector<int64_t> stream(const Sampler& s, int64_t begin, int64_t count) {
  std::vector<int64_t> out;
  for (int64_t p = begin; p < begin + count; ++p) out.push_back(s.at(p));
  return out;
}

TEST(Sampler, SameSeedSameStream) {
  const Sampler a(1000, 42), b(1000, 42);
  EXPECT_EQ(stream(a, 0, 3500), stream(b, 0, 3500));
}

TEST(Sampler, DifferentSeedDifferentStream) {
  const Sampler a(1000, 42), b(1000, 43);
  const auto sa = stream(a, 0, 1000), sb = stream(b, 0, 1000);
  EXPECT_NE(sa, sb);
  // Not just a shifted or slightly changed order: most positions differ.
  int64_t same = 0;
  for (size_t i = 0; i < sa.size(); ++i) same += sa[i] == sb[i];
  EXPECT_LT(same, 50);
}

TEST(Sampler, EachEpochIsAPermutationAndEpochsDiffer) {
  const int64_t n = 777;
  const Sampler s(n, 7);
  std::vector<int64_t> identity(n);
  std::iota(identity.begin(), identity.end(), 0);
  std::vector<std::vector<int64_t>> epochs;
  for (int64_t e = 0; e < 4; ++e) {
    auto perm = stream(s, e * n, n);
    EXPECT_NE(perm, identity) << "epoch " << e << " is not shuffled";
    epochs.push_back(perm);
    std::sort(perm.begin(), perm.end());
    EXPECT_EQ(perm, identity) << "epoch " << e << " is not a permutation";
  }
  for (size_t i = 0; i < epochs.size(); ++i)
    for (size_t j = i + 1; j < epochs.size(); ++j) EXPECT_NE(epochs[i], epochs[j]);
  EXPECT_EQ(s.permutation(2), epochs[2]);
}

TEST(Sampler, RandomAccessEqualsSequential) {
  const int64_t n = 300;
  const Sampler sequential(n, 99);
  const auto expected = stream(sequential, 0, 5 * n);
  // Jump around epochs in a scrambled order with a fresh sampler (its cache starts cold and is
  // rebuilt on every epoch change).
  const Sampler random(n, 99);
  std::vector<int64_t> positions(5 * n);
  std::iota(positions.begin(), positions.end(), 0);
  for (size_t i = 0; i < positions.size(); ++i)
    std::swap(positions[i], positions[(i * 7919 + 13) % positions.size()]);
  for (int64_t p : positions) ASSERT_EQ(random.at(p), expected[static_cast<size_t>(p)]) << p;
}

TEST(Sampler, UniformEnoughOverPositions) {
  // Over many epochs each sample lands in the first half of an epoch about half the time.
  const int64_t n = 16, epochs = 4000;
  const Sampler s(n, 5);
  std::vector<int64_t> first_half(n, 0);
  for (int64_t e = 0; e < epochs; ++e)
    for (int64_t i = 0; i < n / 2; ++i) ++first_half[static_cast<size_t>(s.at(e * n + i))];
  for (int64_t k = 0; k < n; ++k) {
    EXPECT_GT(first_half[k], epochs / 2 - 250) << k;  // ~8 sigma
    EXPECT_LT(first_half[k], epochs / 2 + 250) << k;
  }
}

TEST(Sampler, NoShuffleIsSequentialAndSingleSampleWorks) {
  const Sampler plain(5, 1, /*shuffle=*/false);
  EXPECT_EQ(stream(plain, 0, 12), (std::vector<int64_t>{0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1}));
  const Sampler one(1, 3);
  EXPECT_EQ(stream(one, 0, 4), (std::vector<int64_t>{0, 0, 0, 0}));
}

}  // namespace
}  // namespace zerod
