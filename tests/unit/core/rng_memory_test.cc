#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/memory.h"
#include "core/rng.h"

namespace zerod {
namespace {

TEST(Rng, NormalIsAPureFunctionOfIndex) {
  std::vector<float> whole(1001), parts(1001);
  fill_normal(whole.data(), 1001, 0.0f, 1.0f, 42, 3);
  // The same values generated in two pieces with offsets.
  fill_normal(parts.data(), 500, 0.0f, 1.0f, 42, 3, 0);
  fill_normal(parts.data() + 500, 501, 0.0f, 1.0f, 42, 3, 500);
  EXPECT_EQ(whole, parts);
  std::vector<float> other(1001);
  fill_normal(other.data(), 1001, 0.0f, 1.0f, 42, 4);
  EXPECT_NE(whole, other);
}

TEST(Rng, NormalHasTheRequestedMoments) {
  const int64_t n = 400000;
  std::vector<float> x(n);
  fill_normal(x.data(), n, 0.5f, 0.02f, 1337, 0);
  double sum = 0, sq = 0;
  for (float v : x) sum += v;
  const double mean = sum / n;
  for (float v : x) sq += (v - mean) * (v - mean);
  const double sd = std::sqrt(sq / (n - 1));
  EXPECT_NEAR(mean, 0.5, 4 * 0.02 / std::sqrt(static_cast<double>(n)));
  EXPECT_NEAR(sd, 0.02, 0.02 * 0.01);
}

TEST(Rng, StateRoundTripsAndUniformIsInRange) {
  Rng a(9, 1);
  for (int i = 0; i < 10; ++i) a.next_u64();
  Rng b(a.state());
  for (int i = 0; i < 100; ++i) ASSERT_EQ(a.next_u64(), b.next_u64());
  std::vector<int> counts(7, 0);
  for (int i = 0; i < 70000; ++i) {
    const uint64_t u = a.uniform(7);
    ASSERT_LT(u, 7u);
    ++counts[u];
  }
  for (int c : counts) EXPECT_NEAR(c, 10000, 500);
}

TEST(Memory, TrackerCountsCurrentAndPeakPerCategory) {
  MemoryTracker t;
  {
    Buffer a = host_alloc(1000, MemCategory::kWeights, &t);
    Buffer b = host_alloc(size_t{8} << 20, MemCategory::kActivations, &t);
    EXPECT_EQ(t.current(MemCategory::kWeights), 1000);
    EXPECT_EQ(t.current(MemCategory::kActivations), 8 << 20);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 64, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % (2 << 20), 0u);
    for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(a.as<uint8_t>()[i], 0);
    Buffer moved = std::move(b);
    EXPECT_TRUE(b.empty());
    EXPECT_EQ(t.total(), 1000 + (8 << 20));
  }
  EXPECT_EQ(t.total(), 0);
  EXPECT_EQ(t.peak(MemCategory::kActivations), 8 << 20);
  EXPECT_EQ(t.snapshot().total_peak, 1000 + (8 << 20));
}

}  // namespace
}  // namespace zerod

namespace zerod {
namespace {

TEST(MemoryTracker, DescribesEveryCategoryCurrentAndPeak) {
  MemoryTracker t;
  t.add(MemCategory::kWeights, 2 << 20);
  t.sub(MemCategory::kWeights, 1 << 20);
  t.add(MemCategory::kActivations, 3 << 20);
  const std::string d = t.describe();
  EXPECT_NE(d.find("weights 1.00/2.00"), std::string::npos) << d;
  EXPECT_NE(d.find("activations 3.00/3.00"), std::string::npos) << d;
  EXPECT_NE(d.find("pinned 0.00/0.00"), std::string::npos) << d;  // unused categories shown too
  EXPECT_NE(d.find("disk 0.00/0.00"), std::string::npos) << d;
  EXPECT_NE(d.find("total 4.00/4.00 MiB"), std::string::npos) << d;  // peak of the sum
}

}  // namespace
}  // namespace zerod
