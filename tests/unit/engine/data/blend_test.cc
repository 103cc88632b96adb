// Blending data.train sources by weight: the realised proportions, each source's samples visited
// once per source epoch, the same stream at every world size and after a resume, and the
// InputErrors of bad blends.
#include "engine/data/blend.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

#include "data_test_util.h"
#include "engine/data/loader.h"
#include "engine/data/train_val.h"

namespace zerod {
namespace {

using testing::expect_input_error;
using testing::make_shard;
using testing::TempDir;

TEST(BlendSampler, RealisesTheWeightsInEveryBlock) {
  const BlendSampler blend({10, 1000, 37}, {0.7, 0.2, 0.1}, 1234, true);
  ASSERT_EQ(blend.num_samples(), 1047);
  int64_t sum = 0;
  const std::vector<double> w = {0.7, 0.2, 0.1};
  for (int d = 0; d < 3; ++d) {
    // Greedy assignment: within one position of weight * block.
    EXPECT_NEAR(static_cast<double>(blend.per_block(d)), w[static_cast<size_t>(d)] * kBlendBlock,
                1.0)
        << d;
    sum += blend.per_block(d);
  }
  EXPECT_EQ(sum, kBlendBlock);
  // drawn() agrees with source_at(), over a part block and over whole blocks, and no prefix of
  // the stream strays from the weights by more than a position or two per source.
  const int64_t n = kBlendBlock + 12345;
  std::vector<int64_t> counted(3, 0);
  for (int64_t p = 0; p < n; ++p) {
    const int d = blend.source_at(p);
    ++counted[static_cast<size_t>(d)];
    if (p % 997 == 0) {
      for (int e = 0; e < 3; ++e)
        EXPECT_LE(std::abs(counted[e] - w[e] * static_cast<double>(p + 1)), 2.0) << p << " " << e;
    }
  }
  for (int d = 0; d < 3; ++d) EXPECT_EQ(blend.drawn(d, n), counted[static_cast<size_t>(d)]);
  EXPECT_EQ(blend.drawn(0, 5 * kBlendBlock), 5 * blend.per_block(0));
}

TEST(BlendSampler, EachSourceVisitsItsSamplesOncePerSourceEpoch) {
  const std::vector<int64_t> sizes = {7, 50, 13};
  const BlendSampler blend(sizes, {1.0, 2.0, 1.0}, 99, true);
  // The k-th draw of source d, in stream order.
  std::map<int, std::vector<int64_t>> draws;
  const std::vector<int64_t> first = {0, 7, 57};
  for (int64_t p = 0; p < 4000; ++p) {
    const int d = blend.source_at(p);
    const int64_t idx = blend.at(p);
    ASSERT_GE(idx, first[static_cast<size_t>(d)]);
    ASSERT_LT(idx, first[static_cast<size_t>(d)] + sizes[static_cast<size_t>(d)]);
    draws[d].push_back(idx);
  }
  bool shuffled = false;
  for (const auto& [d, seq] : draws) {
    const int64_t n = sizes[static_cast<size_t>(d)];
    for (size_t e = 0; (e + 1) * n <= seq.size(); ++e) {
      const std::set<int64_t> epoch(seq.begin() + e * n, seq.begin() + (e + 1) * n);
      EXPECT_EQ(static_cast<int64_t>(epoch.size()), n) << "source " << d << " epoch " << e;
      for (int64_t i = 0; i < n; ++i)
        shuffled = shuffled || seq[e * n + i] != first[static_cast<size_t>(d)] + i;
    }
  }
  EXPECT_TRUE(shuffled);
  // Unshuffled: each source in order.
  const BlendSampler ordered(sizes, {1.0, 2.0, 1.0}, 99, false);
  std::map<int, int64_t> next;
  for (int64_t p = 0; p < 500; ++p) {
    const int d = ordered.source_at(p);
    EXPECT_EQ(ordered.at(p),
              first[static_cast<size_t>(d)] + next[d]++ % sizes[static_cast<size_t>(d)]);
  }
}

TEST(BlendSampler, LoaderStreamIsTheSameAtEveryWorldSizeAndAfterAResume) {
  TempDir dir;
  const int64_t T = 4;
  make_shard(dir, "web_0.bin", 1, 4 * 30 + 1);  // 30 samples
  make_shard(dir, "web_1.bin", 2, 4 * 20 + 1);  // 20
  make_shard(dir, "code_0.bin", 3, 4 * 9 + 1);  // 9
  const std::vector<double> weights = {3.0, 1.0};
  const TrainValData data =
      open_train_val({dir.file("web_*.bin"), dir.file("code_*.bin")}, {}, 0.0, T, 65536, weights);
  ASSERT_EQ(data.train_source_samples, (std::vector<int64_t>{50, 9}));
  const int64_t global_batch = 8, steps = 12;
  // The samples of each step, by world size.
  auto run = [&](int world, int64_t micro, int64_t resume_at) {
    std::vector<std::multiset<int64_t>> steps_seen(static_cast<size_t>(steps));
    for (int r = 0; r < world; ++r) {
      DataLoader loader(data.train, 5, true, global_batch, micro, world, r,
                        data.train_source_samples, weights);
      std::vector<int32_t> in(static_cast<size_t>(micro * T)), tg(in.size());
      std::vector<int64_t> idx(static_cast<size_t>(micro));
      for (int64_t s = 0; s < steps; ++s) {
        if (s == resume_at) {  // a fresh loader restored from the state, as after a checkpoint
          const LoaderState state = loader.state();
          loader = DataLoader(data.train, 5, true, global_batch, micro, world, r,
                              data.train_source_samples, weights);
          loader.restore(state);
        }
        for (int64_t m = 0; m < loader.micro_batches_per_step(); ++m) {
          loader.next_micro_batch(in.data(), tg.data(), idx.data());
          for (int64_t b = 0; b < micro; ++b) {
            steps_seen[static_cast<size_t>(s)].insert(idx[static_cast<size_t>(b)]);
            // The sample read is the one the index names (source 3's tokens for code).
            EXPECT_EQ(in[static_cast<size_t>(b * T)] / 1000, idx[static_cast<size_t>(b)] < 30 ? 1
                                                             : idx[static_cast<size_t>(b)] < 50
                                                                 ? 2
                                                                 : 3);
          }
        }
      }
    }
    return steps_seen;
  };
  const auto one = run(1, 8, -1);
  EXPECT_EQ(run(2, 2, -1), one);
  EXPECT_EQ(run(4, 1, 5), one);  // resharded and resumed mid-epoch
  // Three quarters of the stream is web (samples 0..49), a quarter code (50..58).
  int64_t code = 0;
  for (const auto& s : one)
    for (int64_t i : s) code += i >= 50;
  EXPECT_NEAR(static_cast<double>(code) / (steps * global_batch), 0.25, 0.02);

  // The state carries the blend: the same weights (up to a factor) resume, others are refused.
  DataLoader a(data.train, 5, true, global_batch, 8, 1, 0, data.train_source_samples, weights);
  const LoaderState state = a.state();
  EXPECT_EQ(state.blend_weights, weights);
  DataLoader scaled(data.train, 5, true, global_batch, 8, 1, 0, data.train_source_samples,
                    {0.75, 0.25});
  EXPECT_NO_THROW(scaled.restore(state));
  DataLoader other(data.train, 5, true, global_batch, 8, 1, 0, data.train_source_samples,
                   {1.0, 1.0});
  expect_input_error([&] { other.restore(state); }, {"blend weights [3, 1]", "[1, 1]"});
  DataLoader unblended(data.train, 5, true, global_batch, 8, 1, 0);
  expect_input_error([&] { unblended.restore(state); }, {"blend weights [3, 1]"});
}

TEST(BlendSampler, BadBlendsNameTheSource) {
  TempDir dir;
  make_shard(dir, "a.bin", 1, 41);
  make_shard(dir, "short.bin", 2, 3);
  expect_input_error(
      [&] {
        open_train_val({dir.file("a.bin"), dir.file("*.bin")}, {}, 0.0, 4, 65536, {1.0, 1.0});
      },
      {"data.train[1].path", "a.bin", "also matches data.train[0].path"});
  expect_input_error(
      [&] {
        open_train_val({dir.file("a.bin"), dir.file("short.bin")}, {}, 0.0, 4, 65536, {1.0, 1.0});
      },
      {"data.train[1].path", "short.bin", "no sample"});
  expect_input_error([&] { open_train_val({dir.file("a.bin")}, {}, 0.1, 4, 65536, {1.0}); },
                     {"data.val_fraction", "blend"});
}

}  // namespace
}  // namespace zerod
