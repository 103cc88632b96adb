// TokenDataset windows, shard boundaries, token checks, and the train/validation split.
#include "engine/data/dataset.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "data_test_util.h"
#include "engine/data/train_val.h"

namespace zerod {
namespace {

using testing::expect_input_error;
using testing::make_shard;
using testing::TempDir;

constexpr int64_t kVocab = 65536;

TEST(TokenDataset, WindowsStepBySeqLenWithinEachShard) {
  TempDir dir;
  const int64_t T = 4;
  // 13 tokens -> windows at 0,4,8 (the one at 12 would need 17): (13-1)/4 = 3 samples.
  // 5 tokens = T+1 -> exactly 1 sample. 3 tokens < T+1 -> none. 9 tokens -> 2 samples.
  // 8 tokens = 2T -> 1 sample (a second window would need token 8).
  const std::vector<std::string> paths = {
      make_shard(dir, "a.bin", 1, 13), make_shard(dir, "b.bin", 2, 5),
      make_shard(dir, "c.bin", 3, 3), make_shard(dir, "d.bin", 4, 9),
      make_shard(dir, "e.bin", 5, 8)};
  TokenDataset ds(paths, T, kVocab, "data.train");
  ASSERT_EQ(ds.num_samples(), 3 + 1 + 0 + 2 + 1);
  EXPECT_EQ(ds.num_shards(), 5);
  EXPECT_EQ(ds.num_tokens(), 13 + 5 + 3 + 9 + 8);

  // Expected (shard, start token) of each sample, written out from the rule.
  const std::vector<std::pair<int, int>> expected = {{1, 0}, {1, 4}, {1, 8}, {2, 0},
                                                     {4, 0}, {4, 4}, {5, 0}};
  std::vector<int32_t> in(T), tg(T);
  for (int64_t k = 0; k < ds.num_samples(); ++k) {
    ds.read_sample(k, in.data(), tg.data());
    const auto [s, start] = expected[static_cast<size_t>(k)];
    for (int64_t t = 0; t < T; ++t) {
      EXPECT_EQ(in[t], s * 1000 + start + t) << "sample " << k << " t " << t;
      EXPECT_EQ(tg[t], s * 1000 + start + t + 1) << "sample " << k << " t " << t;
    }
  }
  const auto loc = ds.locate(4);
  EXPECT_EQ(loc.shard, 3);  // shard c (index 2) has no samples and is skipped
  EXPECT_EQ(loc.token, 0);
}

// Before, a bad token was only found when its sample was read (possibly thousands of steps in);
// the constructor succeeded. Now opening the dataset refuses it, however far into the shard.
TEST(TokenDataset, TokenAtOrAboveVocabNearTheEndIsRefusedWhenOpened) {
  TempDir dir;
  const std::string good = make_shard(dir, "a.bin", 0, 100);  // tokens 0..99
  std::vector<uint16_t> tokens(1000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i % 256);
  tokens[997] = 300;  // the only bad token, in the shard's last sample
  const std::string bad = dir.file("b.bin");
  write_shard(bad, tokens);
  expect_input_error(
      [&] {
        TokenDataset ds({good, bad}, 8, 256, "data.train");
      },
      {"data.train", bad, "token 300", "position 997", "vocab_size 256"});
  // The boundary: vocab_size == max token is refused, max token + 1 opens.
  expect_input_error([&] { TokenDataset ds({bad}, 8, 300, "data.train"); },
                     {bad, "token 300", "position 997", "vocab_size 300"});
  TokenDataset ok({good, bad}, 8, 301, "data.train");
  EXPECT_EQ(ok.shard(1).max_token(), 300);
  EXPECT_EQ(ok.num_samples(), 99 / 8 + 999 / 8);
}

TEST(TokenDataset, GoodDatasetOpensAndReadsEverySample) {
  TempDir dir;
  const std::vector<std::string> paths = {make_shard(dir, "a.bin", 1, 50),
                                          make_shard(dir, "b.bin", 2, 40)};
  TokenDataset ds(paths, 4, 2040, "data.train");  // largest token is 2039
  EXPECT_EQ(ds.shard(0).max_token(), 1049);
  EXPECT_EQ(ds.shard(1).max_token(), 2039);
  std::vector<int32_t> in(4), tg(4);
  for (int64_t k = 0; k < ds.num_samples(); ++k) ds.read_sample(k, in.data(), tg.data());
  const TokenDataset sub = ds.subset(1, 3, "data.val");  // shares the shards, no new check
  EXPECT_EQ(&sub.shard(1), &ds.shard(1));
}

// The per-read check stays as a backstop for a shard rewritten in place after it was opened.
TEST(TokenDataset, TokenChangedOnDiskAfterOpenIsCaughtWhenRead) {
  TempDir dir;
  std::vector<uint16_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  const std::string path = dir.file("v.bin");
  write_shard(path, tokens);
  TokenDataset ds({path}, 4, 256, "data.train");
  ASSERT_EQ(ds.num_samples(), 2);
  {
    // Overwrite token 7 in place (same inode, so the shared mapping sees it on Linux).
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(kShardHeaderBytes + 2 * 7);
    const uint16_t v = 300;
    f.write(reinterpret_cast<const char*>(&v), 2);
  }
  std::vector<int32_t> in(4), tg(4);
  ds.read_sample(0, in.data(), tg.data());  // tokens 0..4 are fine
  EXPECT_EQ(tg[3], 5);
  expect_input_error([&] { ds.read_sample(1, in.data(), tg.data()); },
                     {path, "token 300", "position 7", "vocab_size 256"});
}

// uint32 shards (vocabularies above 65536) are read like uint16 ones, and the two widths mix.
TEST(TokenDataset, ReadsUint32ShardsAndMixesWidths) {
  TempDir dir;
  std::vector<uint32_t> wide(9);
  for (size_t i = 0; i < wide.size(); ++i) wide[i] = static_cast<uint32_t>(100000 + i);
  const std::string a = dir.file("a.bin");
  write_shard(a, std::span<const uint32_t>(wide));
  const std::string b = make_shard(dir, "b.bin", 2, 5);
  TokenDataset ds({a, b}, /*seq_len=*/4, /*vocab_size=*/128256);
  ASSERT_EQ(ds.num_samples(), 3);  // (9 - 1) / 4 + (5 - 1) / 4
  std::vector<int32_t> in(4), tg(4);
  ds.read_sample(1, in.data(), tg.data());
  EXPECT_EQ(in, (std::vector<int32_t>{100004, 100005, 100006, 100007}));
  EXPECT_EQ(tg, (std::vector<int32_t>{100005, 100006, 100007, 100008}));
  ds.read_sample(2, in.data(), tg.data());
  EXPECT_EQ(in, (std::vector<int32_t>{2000, 2001, 2002, 2003}));

  // A uint32 token at or above the vocabulary is refused when opened, naming shard and position.
  wide[6] = 128256;
  write_shard(a, std::span<const uint32_t>(wide));
  expect_input_error([&] { TokenDataset d({a}, 4, 128256, "data.train"); },
                     {"data.train", a, "token 128256", "position 6", "vocab_size 128256"});
}

TEST(TokenDataset, AllShardsTooShortIsAnInputError) {
  TempDir dir;
  const std::vector<std::string> paths = {make_shard(dir, "a.bin", 1, 8),
                                          make_shard(dir, "b.bin", 2, 16)};
  expect_input_error([&] { TokenDataset ds(paths, 16, kVocab, "data.train"); },
                     {"data.train", "shorter than seq_len + 1 = 17 tokens", paths[1], "16 tokens"});
  // 17 tokens is enough for one sample.
  EXPECT_EQ(TokenDataset({make_shard(dir, "c.bin", 3, 17)}, 16, kVocab).num_samples(), 1);
}

TEST(TokenDataset, NoFilesIsAnInputError) {
  expect_input_error([] { TokenDataset ds({}, 8, kVocab, "data.val"); }, {"data.val", "no shard"});
}

TEST(TokenDataset, BadShardInListIsReported) {
  TempDir dir;
  const std::string good = make_shard(dir, "a.bin", 1, 50);
  const std::string bad = dir.file("b.bin");
  testing::write_bytes(bad, testing::shard_bytes(20240520, 1, 50, std::vector<uint16_t>(10, 1)));
  expect_input_error([&] { TokenDataset ds({good, bad}, 8, kVocab); }, {bad, "truncated"});
}

TEST(TokenDataset, SubsetRenumbersAndSharesShards) {
  TempDir dir;
  TokenDataset ds({make_shard(dir, "a.bin", 1, 41)}, 4, kVocab);  // 10 samples
  ASSERT_EQ(ds.num_samples(), 10);
  const TokenDataset sub = ds.subset(3, 7, "part");
  ASSERT_EQ(sub.num_samples(), 4);
  EXPECT_EQ(sub.what(), "part");
  std::vector<int32_t> a(4), b(4), ta(4), tb(4);
  for (int64_t k = 0; k < 4; ++k) {
    sub.read_sample(k, a.data(), ta.data());
    ds.read_sample(3 + k, b.data(), tb.data());
    EXPECT_EQ(a, b);
    EXPECT_EQ(ta, tb);
  }
  EXPECT_THROW(sub.read_sample(4, a.data(), ta.data()), Error);
}

// Distinct first input token -> distinct sample; used to compare sample sets by content.
std::set<int32_t> first_tokens(const TokenDataset& ds) {
  std::set<int32_t> out;
  std::vector<int32_t> in(static_cast<size_t>(ds.seq_len())), tg(in.size());
  for (int64_t k = 0; k < ds.num_samples(); ++k) {
    ds.read_sample(k, in.data(), tg.data());
    out.insert(in[0]);
  }
  return out;
}

TEST(TrainVal, FractionHoldsOutTheLastSamplesDisjointFromTrain) {
  TempDir dir;
  make_shard(dir, "train_000.bin", 1, 33);  // 8 samples of T=4
  make_shard(dir, "train_001.bin", 2, 9);   // 2 samples
  const TrainValData data = open_train_val({dir.file("train_*.bin")}, {}, 0.25, 4, kVocab);
  ASSERT_TRUE(data.val.has_value());
  // ceil(0.25 * 10) = 3 held out: the last 3 samples in file order.
  EXPECT_EQ(data.val->num_samples(), 3);
  EXPECT_EQ(data.train.num_samples(), 7);
  const auto train = first_tokens(data.train);
  const auto val = first_tokens(*data.val);
  EXPECT_EQ(train.size(), 7u);
  EXPECT_EQ(val, (std::set<int32_t>{1028, 2000, 2004}));
  for (int32_t t : val) EXPECT_EQ(train.count(t), 0u) << t;
}

TEST(TrainVal, HeldOutCountRoundsUpButNotOnFloatNoise) {
  EXPECT_EQ(held_out_samples(10, 0.7), 7);  // 0.7 * 10 = 7.000000000000001 in doubles
  EXPECT_EQ(held_out_samples(10, 0.71), 8);
  EXPECT_EQ(held_out_samples(1000, 0.001), 1);
  EXPECT_EQ(held_out_samples(1000, 0.0001), 1);  // a positive fraction holds out >= 1
  EXPECT_EQ(held_out_samples(1000, 0.0), 0);
}

TEST(TrainVal, NoValidationWithoutValOrFraction) {
  TempDir dir;
  make_shard(dir, "t.bin", 1, 33);
  const TrainValData data = open_train_val({dir.file("t.bin")}, {}, 0.0, 4, kVocab);
  EXPECT_FALSE(data.val.has_value());
  EXPECT_EQ(data.train.num_samples(), 8);
}

TEST(TrainVal, ExplicitValGlobsAreTheirOwnDataset) {
  TempDir dir;
  make_shard(dir, "train_0.bin", 1, 33);
  make_shard(dir, "val_0.bin", 2, 17);
  const TrainValData data =
      open_train_val({dir.file("train_*.bin")}, {dir.file("val_*.bin")}, 0.0, 4, kVocab);
  ASSERT_TRUE(data.val.has_value());
  EXPECT_EQ(data.train.num_samples(), 8);
  EXPECT_EQ(data.val->num_samples(), 4);
  EXPECT_EQ(data.val->what(), "data.val");
  EXPECT_EQ(*first_tokens(*data.val).begin(), 2000);
}

TEST(TrainVal, BadTokenInValShardsIsRefusedWhenOpened) {
  TempDir dir;
  const std::string train = make_shard(dir, "train_0.bin", 0, 33);  // tokens 0..32
  const std::string val = make_shard(dir, "val_0.bin", 0, 40);      // tokens 0..39
  expect_input_error([&] { open_train_val({train}, {val}, 0.0, 4, 36); },
                     {"data.val", val, "token 36", "position 36", "vocab_size 36"});
  EXPECT_NO_THROW(open_train_val({train}, {val}, 0.0, 4, 40));
}

TEST(TrainVal, Errors) {
  TempDir dir;
  make_shard(dir, "train_0.bin", 1, 33);
  const std::string train = dir.file("train_*.bin");
  expect_input_error([&] { open_train_val({}, {}, 0.0, 4, kVocab); }, {"data.train", "no shard"});
  expect_input_error([&] { open_train_val({dir.file("tr_*.bin")}, {}, 0.0, 4, kVocab); },
                     {"data.train", "tr_*.bin", "no file matches"});
  expect_input_error([&] { open_train_val({train}, {dir.file("v_*.bin")}, 0.0, 4, kVocab); },
                     {"data.val", "v_*.bin"});
  expect_input_error([&] { open_train_val({train}, {}, 1.0, 4, kVocab); },
                     {"data.val_fraction", "found 1", "[0, 1)"});
  expect_input_error([&] { open_train_val({train}, {train}, 0.1, 4, kVocab); },
                     {"data.val_fraction", "data.val is set"});
  expect_input_error(
      [&] { open_train_val({train}, {dir.path().string() + "/./train_0.bin"}, 0.0, 4, kVocab); },
      {"data.val", "train_0.bin", "also matches data.train"});
  // 8 samples, 0.99 holds out ceil(7.92) = 8: nothing left to train on.
  expect_input_error([&] { open_train_val({train}, {}, 0.99, 4, kVocab); },
                     {"data.val_fraction", "8 samples", "no training sample"});
}

}  // namespace
}  // namespace zerod
