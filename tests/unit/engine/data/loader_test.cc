// DataLoader: world-size invariance of the global batch, position save/restore; EvalLoader.
#include "engine/data/loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <set>

#include "data_test_util.h"
#include "engine/data/eval_loader.h"

namespace zerod {
namespace {

using testing::expect_input_error;
using testing::TempDir;

constexpr int64_t kT = 4;
constexpr int64_t kVocab = 65536;

// 3 shards, 25 + 12 + 8 = 45 samples of T=4; token values identify shard and position.
TokenDataset make_dataset(const TempDir& dir) {
  std::vector<std::string> paths;
  const int sizes[] = {101, 49, 33};
  for (int s = 0; s < 3; ++s) {
    std::vector<uint16_t> tokens(static_cast<size_t>(sizes[s]));
    for (int i = 0; i < sizes[s]; ++i) tokens[i] = static_cast<uint16_t>((s + 1) * 1000 + i);
    paths.push_back(dir.file("shard_" + std::to_string(s) + ".bin"));
    write_shard(paths.back(), tokens);
  }
  return TokenDataset(paths, kT, kVocab, "data.train");
}

// One step of a world: each rank's micro-batches, rank after rank, as sample indices. Also
// checks every row's tokens equal the dataset's sample.
std::vector<int64_t> run_step(std::vector<DataLoader>& ranks) {
  std::vector<int64_t> step;
  for (DataLoader& loader : ranks) {
    EXPECT_TRUE(loader.at_step_boundary());
    const int64_t B = loader.micro_batch();
    std::vector<int32_t> in(B * kT), tg(B * kT), ref_in(kT), ref_tg(kT);
    std::vector<int64_t> idx(B);
    for (int64_t m = 0; m < loader.micro_batches_per_step(); ++m) {
      loader.next_micro_batch(in.data(), tg.data(), idx.data());
      for (int64_t b = 0; b < B; ++b) {
        loader.dataset().read_sample(idx[b], ref_in.data(), ref_tg.data());
        EXPECT_TRUE(std::equal(ref_in.begin(), ref_in.end(), in.begin() + b * kT));
        EXPECT_TRUE(std::equal(ref_tg.begin(), ref_tg.end(), tg.begin() + b * kT));
        step.push_back(idx[b]);
      }
    }
    EXPECT_TRUE(loader.at_step_boundary());
  }
  return step;
}

std::vector<DataLoader> make_world(const TokenDataset& ds, uint64_t seed, int64_t gb, int64_t micro,
                                   int world) {
  std::vector<DataLoader> ranks;
  for (int r = 0; r < world; ++r) ranks.emplace_back(ds, seed, true, gb, micro, world, r);
  return ranks;
}

TEST(DataLoader, GlobalBatchIsTheSameForAnyWorldSize) {
  TempDir dir;
  const TokenDataset ds = make_dataset(dir);
  const int64_t gb = 8;
  // (world, micro): world 1 x accum 4, world 2 x accum 2, world 4 x accum 1, world 2 x accum 4,
  // world 8 x accum 1.
  const std::vector<std::pair<int, int64_t>> shapes = {{1, 2}, {2, 2}, {4, 2}, {2, 1}, {8, 1}};
  std::vector<std::vector<DataLoader>> worlds;
  for (const auto& [world, micro] : shapes)
    worlds.push_back(make_world(ds, 1234, gb, micro, world));
  EXPECT_EQ(worlds[0][0].micro_batches_per_step(), 4);
  EXPECT_EQ(worlds[1][0].micro_batches_per_step(), 2);
  EXPECT_EQ(worlds[2][0].micro_batches_per_step(), 1);

  std::multiset<int64_t> seen_epoch0;
  const int64_t steps = 14;  // 112 samples: crosses two epoch boundaries of 45
  for (int64_t s = 0; s < steps; ++s) {
    const std::vector<int64_t> reference = run_step(worlds[0]);
    ASSERT_EQ(reference.size(), static_cast<size_t>(gb));
    for (size_t w = 1; w < worlds.size(); ++w) {
      const std::vector<int64_t> got = run_step(worlds[w]);
      // The requirement: the same multiset of samples per step ...
      EXPECT_EQ(std::multiset<int64_t>(got.begin(), got.end()),
                std::multiset<int64_t>(reference.begin(), reference.end()))
          << "step " << s << " world " << shapes[w].first;
      // ... and, by construction, even the same order (rank r holds the r-th slice).
      EXPECT_EQ(got, reference) << "step " << s << " world " << shapes[w].first;
    }
    for (int64_t i : reference)
      if (static_cast<int64_t>(seen_epoch0.size()) < ds.num_samples()) seen_epoch0.insert(i);
    for (const auto& world : worlds) EXPECT_EQ(world[0].position(), (s + 1) * gb);
  }
  // The first 45 stream positions visit every sample exactly once.
  EXPECT_EQ(std::set<int64_t>(seen_epoch0.begin(), seen_epoch0.end()).size(), 45u);
  EXPECT_EQ(worlds[0][0].epoch(), steps * gb / 45);
}

TEST(DataLoader, RanksOfAStepHoldDisjointSlices) {
  TempDir dir;
  const TokenDataset ds = make_dataset(dir);
  auto world = make_world(ds, 9, 12, 3, 2);  // 6 per rank, 2 micro-batches of 3
  std::vector<int32_t> in(3 * kT), tg(3 * kT);
  std::vector<int64_t> r0(6), r1(6);
  for (int m = 0; m < 2; ++m) {
    world[0].next_micro_batch(in.data(), tg.data(), r0.data() + 3 * m);
    world[1].next_micro_batch(in.data(), tg.data(), r1.data() + 3 * m);
  }
  const Sampler sampler(ds.num_samples(), 9);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(r0[i], sampler.at(i));
    EXPECT_EQ(r1[i], sampler.at(6 + i));
  }
}

TEST(DataLoader, PositionSaveRestoreReproducesTheFollowingBatches) {
  TempDir dir;
  const TokenDataset ds = make_dataset(dir);
  DataLoader a(ds, 77, true, 6, 3, 1, 0);
  std::vector<int32_t> in(3 * kT), tg(3 * kT);
  for (int i = 0; i < 10; ++i) a.next_micro_batch(in.data(), tg.data());  // 5 steps
  const LoaderState saved = a.state();
  EXPECT_EQ(saved.position, 30);
  EXPECT_EQ(saved.seed, 77u);
  EXPECT_EQ(saved.num_samples, 45);

  std::vector<std::vector<int32_t>> expected_in, expected_tg;
  for (int i = 0; i < 16; ++i) {
    a.next_micro_batch(in.data(), tg.data());
    expected_in.push_back(in);
    expected_tg.push_back(tg);
  }
  // A fresh loader (as after a restart) restored to the saved state continues identically.
  DataLoader b(ds, 77, true, 6, 3, 1, 0);
  b.restore(saved);
  EXPECT_EQ(b.position(), 30);
  for (int i = 0; i < 16; ++i) {
    b.next_micro_batch(in.data(), tg.data());
    EXPECT_EQ(in, expected_in[i]) << i;
    EXPECT_EQ(tg, expected_tg[i]) << i;
  }
  // A loader that did not restore starts elsewhere.
  DataLoader c(ds, 77, true, 6, 3, 1, 0);
  c.next_micro_batch(in.data(), tg.data());
  EXPECT_NE(in, expected_in[0]);
}

TEST(DataLoader, RestoreAtAnotherWorldSizeContinuesTheSameGlobalBatches) {
  TempDir dir;
  const TokenDataset ds = make_dataset(dir);
  auto one = make_world(ds, 5, 8, 4, 1);
  for (int s = 0; s < 3; ++s) run_step(one);
  const LoaderState saved = one[0].state();
  auto four = make_world(ds, 5, 8, 1, 4);
  for (DataLoader& l : four) l.restore(saved);
  for (int s = 0; s < 5; ++s) EXPECT_EQ(run_step(four), run_step(one)) << s;
}

TEST(DataLoader, MidStepPositionIsTheStepStart) {
  TempDir dir;
  const TokenDataset ds = make_dataset(dir);
  DataLoader a(ds, 1, true, 8, 2, 1, 0);  // 4 micro-batches per step
  std::vector<int32_t> in(2 * kT), tg(2 * kT);
  std::vector<int64_t> first(2), again(2);
  a.next_micro_batch(in.data(), tg.data(), first.data());
  a.next_micro_batch(in.data(), tg.data());
  EXPECT_FALSE(a.at_step_boundary());
  EXPECT_EQ(a.micro_index(), 2);
  EXPECT_EQ(a.position(), 0);
  a.set_position(a.position());  // back to the start of the step
  EXPECT_TRUE(a.at_step_boundary());
  a.next_micro_batch(in.data(), tg.data(), again.data());
  EXPECT_EQ(first, again);
}

TEST(DataLoader, RestoreRejectsAnotherStream) {
  TempDir dir;
  const TokenDataset ds = make_dataset(dir);
  DataLoader a(ds, 1, true, 8, 2, 1, 0);
  expect_input_error([&] { a.restore({16, 2, 45, {}}); }, {"data.seed 2", "data.seed 1"});
  expect_input_error([&] { a.restore({16, 1, 44, {}}); }, {"44", "45", "changed"});
  a.restore({16, 1, 45, {}});
  EXPECT_EQ(a.position(), 16);
}

TEST(DataLoader, BatchShapesMustDivide) {
  TempDir dir;
  const TokenDataset ds = make_dataset(dir);
  expect_input_error([&] { DataLoader l(ds, 1, true, 10, 1, 4, 0); },
                     {"train_batch_size 10", "world size 4"});
  expect_input_error(
      [&] { DataLoader l(ds, 1, true, 12, 4, 2, 0); },
      {"train_batch_size 12", "6 samples per rank", "train_micro_batch_size_per_gpu 4"});
}

TEST(EvalLoader, SequentialPassSplitAcrossRanksAndRestartable) {
  TempDir dir;
  const TokenDataset ds = make_dataset(dir);  // 45 samples
  // micro 4 x world 2 = 8 per global micro-batch: 5 full ones cover samples 0..39.
  std::vector<EvalLoader> ranks;
  for (int r = 0; r < 2; ++r) ranks.emplace_back(ds, 4, 2, r);
  EXPECT_EQ(ranks[0].num_micro_batches(), 5);
  std::vector<int32_t> in(4 * kT), tg(4 * kT);
  std::vector<int64_t> idx(4), all;
  for (int pass = 0; pass < 2; ++pass) {
    all.clear();
    for (int64_t m = 0; m < 5; ++m)
      for (EvalLoader& l : ranks) {
        ASSERT_TRUE(l.next_micro_batch(in.data(), tg.data(), idx.data()));
        all.insert(all.end(), idx.begin(), idx.end());
        std::vector<int32_t> ref_in(kT), ref_tg(kT);
        ds.read_sample(idx[3], ref_in.data(), ref_tg.data());
        EXPECT_TRUE(std::equal(ref_in.begin(), ref_in.end(), in.begin() + 3 * kT));
      }
    for (EvalLoader& l : ranks) EXPECT_FALSE(l.next_micro_batch(in.data(), tg.data()));
    std::vector<int64_t> expected(40);
    for (int64_t i = 0; i < 40; ++i) expected[i] = i;
    EXPECT_EQ(all, expected) << "pass " << pass;
    for (EvalLoader& l : ranks) l.restart();
  }
}

TEST(EvalLoader, TooFewSamplesIsAnInputError) {
  TempDir dir;
  const TokenDataset ds = make_dataset(dir);
  const TokenDataset small = ds.subset(40, 45, "data.val");  // 5 samples
  expect_input_error([&] { EvalLoader l(small, 3, 2, 0); },
                     {"data.val", "5 validation samples", "3 x world size 2 = 6"});
  EXPECT_EQ(EvalLoader(small, 5, 1, 0).num_micro_batches(), 1);
}

TEST(DataLoader, WithoutShuffleVisitsSamplesInFileOrder) {
  TempDir dir;
  const TokenDataset ds = make_dataset(dir);            // 45 samples
  DataLoader a(ds, 77, /*shuffle=*/false, 4, 2, 2, 1);  // rank 1 of 2: samples 2,3 then 6,7
  std::vector<int32_t> in(2 * kT), tg(2 * kT);
  std::vector<int64_t> idx(2);
  a.next_micro_batch(in.data(), tg.data(), idx.data());
  EXPECT_EQ(idx, (std::vector<int64_t>{2, 3}));
  a.next_micro_batch(in.data(), tg.data(), idx.data());
  EXPECT_EQ(idx, (std::vector<int64_t>{6, 7}));
  for (int step = 2; step < 11; ++step) a.next_micro_batch(in.data(), tg.data(), idx.data());
  EXPECT_EQ(idx, (std::vector<int64_t>{42, 43}));        // step 10
  a.next_micro_batch(in.data(), tg.data(), idx.data());  // positions 46, 47: the next epoch
  EXPECT_EQ(idx, (std::vector<int64_t>{1, 2}));
}

}  // namespace
}  // namespace zerod
