// TokenShard / write_shard / expand_globs: the llm.c format, and clear errors for bad files.
#include "engine/data/shard.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <numeric>

#include "data_test_util.h"
#include "engine/data/glob.h"

namespace zerod {
namespace {

using testing::expect_input_error;
using testing::shard_bytes;
using testing::shard_bytes32;
using testing::TempDir;
using testing::write_bytes;

TEST(TokenShard, ReadsAHandBuiltLlmcFile) {
  TempDir dir;
  const std::vector<uint16_t> tokens = {0, 1, 255, 256, 50256, 65535};
  const std::string path = dir.file("a.bin");
  write_bytes(path, shard_bytes(20240520, 1, 6, tokens));
  TokenShard shard(path);
  EXPECT_EQ(shard.path(), path);
  ASSERT_EQ(shard.num_tokens(), 6);
  for (size_t i = 0; i < tokens.size(); ++i) EXPECT_EQ(shard.tokens()[i], tokens[i]) << i;
}

TEST(TokenShard, MaxTokenIsComputedOnOpenAndKeptAcrossMoves) {
  TempDir dir;
  std::vector<uint16_t> tokens(4099, 7);  // odd length: exercises the vector loop's tail
  tokens[4097] = 40000;
  tokens[2] = 300;
  const std::string path = dir.file("m.bin");
  write_shard(path, tokens);
  TokenShard a(path);
  EXPECT_EQ(a.max_token(), 40000);
  EXPECT_EQ(a.first_token_at_least(8), 2);
  EXPECT_EQ(a.first_token_at_least(301), 4097);
  EXPECT_EQ(a.first_token_at_least(40001), -1);
  TokenShard b(std::move(a));
  EXPECT_EQ(b.max_token(), 40000);
}

TEST(TokenShard, WriteThenReadRoundTrips) {
  TempDir dir;
  std::vector<uint16_t> tokens(5000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 7919) % 65536);
  const std::string path = dir.file("rt.bin");
  write_shard(path, tokens);
  // The bytes are exactly the llm.c layout, built independently.
  EXPECT_EQ(testing::read_bytes(path),
            shard_bytes(20240520, 1, static_cast<int32_t>(tokens.size()), tokens));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  TokenShard shard(path);
  ASSERT_EQ(shard.num_tokens(), static_cast<int64_t>(tokens.size()));
  EXPECT_TRUE(std::equal(tokens.begin(), tokens.end(), shard.tokens()));
}

TEST(TokenShard, WriteReplacesAnExistingFile) {
  TempDir dir;
  const std::string path = dir.file("x.bin");
  write_shard(path, std::vector<uint16_t>{1, 2, 3});
  write_shard(path, std::vector<uint16_t>{9, 8});
  TokenShard shard(path);
  ASSERT_EQ(shard.num_tokens(), 2);
  EXPECT_EQ(shard.tokens()[0], 9);
  EXPECT_EQ(shard.tokens()[1], 8);
}

TEST(TokenShard, MovedShardKeepsItsMapping) {
  TempDir dir;
  const std::string path = dir.file("m.bin");
  write_shard(path, std::vector<uint16_t>{4, 5, 6});
  TokenShard a(path);
  TokenShard b(std::move(a));
  EXPECT_EQ(b.num_tokens(), 3);
  EXPECT_EQ(b.tokens()[2], 6);
  std::vector<TokenShard> many;
  for (int i = 0; i < 20; ++i) many.emplace_back(path);  // reallocation moves them
  for (const TokenShard& s : many) EXPECT_EQ(s.tokens()[0], 4);
}

TEST(TokenShard, ReadsAHandBuiltUint32LlmcFile) {
  TempDir dir;
  const std::string path = dir.file("wide.bin");
  const std::vector<uint32_t> tokens = {0, 1, 65535, 65536, 128000, 128255, 7};
  write_bytes(path, shard_bytes32(20240801, 7, 7, tokens));
  TokenShard shard(path);
  EXPECT_EQ(shard.token_bytes(), 4);
  ASSERT_EQ(shard.num_tokens(), 7);
  for (size_t i = 0; i < tokens.size(); ++i) {
    EXPECT_EQ(shard.tokens32()[i], tokens[i]) << i;
    EXPECT_EQ(shard.token(static_cast<int64_t>(i)), tokens[i]) << i;
  }
  EXPECT_EQ(shard.max_token(), 128255u);
  EXPECT_EQ(shard.first_token_at_least(65536), 3);
  EXPECT_EQ(shard.first_token_at_least(128256), -1);
}

TEST(TokenShard, Uint16ShardsReportTheirWidth) {
  TempDir dir;
  const std::string path = dir.file("narrow.bin");
  write_bytes(path, shard_bytes(20240520, 1, 3, {5, 65535, 2}));
  TokenShard shard(path);
  EXPECT_EQ(shard.token_bytes(), 2);
  EXPECT_EQ(shard.token(1), 65535u);
  EXPECT_EQ(shard.max_token(), 65535u);
}

TEST(TokenShard, Uint32WriteThenReadRoundTripsInLlmcLayout) {
  TempDir dir;
  const std::string path = dir.file("rt32.bin");
  std::vector<uint32_t> tokens(5001);
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<uint32_t>((i * 104729) % 200000);
  write_shard(path, std::span<const uint32_t>(tokens));
  // Byte for byte what llm.c's write_datafile(..., "llama-3") writes.
  EXPECT_EQ(testing::read_bytes(path),
            shard_bytes32(20240801, 7, static_cast<int32_t>(tokens.size()), tokens));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  TokenShard shard(path);
  ASSERT_EQ(shard.token_bytes(), 4);
  ASSERT_EQ(shard.num_tokens(), static_cast<int64_t>(tokens.size()));
  EXPECT_TRUE(std::equal(tokens.begin(), tokens.end(), shard.tokens32()));
  EXPECT_EQ(shard.max_token(), *std::max_element(tokens.begin(), tokens.end()));
  TokenShard moved(std::move(shard));
  EXPECT_EQ(moved.token_bytes(), 4);
  EXPECT_EQ(moved.token(4), tokens[4]);
}

TEST(TokenShardErrors, MissingFile) {
  TempDir dir;
  const std::string path = dir.file("nope.bin");
  expect_input_error([&] { TokenShard s(path); }, {path, "No such file"});
}

TEST(TokenShardErrors, Directory) {
  TempDir dir;
  expect_input_error([&] { TokenShard s(dir.path().string()); },
                     {dir.path().string(), "directory", "expected a regular file"});
}

TEST(TokenShardErrors, EmptyFile) {
  TempDir dir;
  const std::string path = dir.file("empty.bin");
  write_bytes(path, {});
  expect_input_error([&] { TokenShard s(path); }, {path, "empty (0 bytes)", "20240520"});
}

TEST(TokenShardErrors, ShorterThanHeader) {
  TempDir dir;
  const std::string path = dir.file("short.bin");
  auto bytes = shard_bytes(20240520, 1, 10, {});
  bytes.resize(100);
  write_bytes(path, bytes);
  expect_input_error([&] { TokenShard s(path); }, {path, "truncated", "100 bytes", "1024-byte"});
}

// The message never quotes the file's bytes: the daemon may run a job for someone who cannot read
// the file (data.train: /etc/shadow) and sends the message back to them.
std::string shard_error(const std::string& path) {
  try {
    TokenShard s(path);
  } catch (const InputError& e) {
    std::string m = e.what();
    for (size_t at; (at = m.find(path)) != std::string::npos;) m.erase(at, path.size());
    return m;  // without the path, which may hold anything
  }
  ADD_FAILURE() << path << " was accepted";
  return "";
}

TEST(TokenShardErrors, WrongMagicSaysExpectedAndNeverQuotesTheFile) {
  TempDir dir;
  const std::string path = dir.file("magic.bin");
  write_bytes(path, shard_bytes(12345, 1, 2, {1, 2}));
  expect_input_error([&] { TokenShard s(path); }, {path, "wrong magic", "expected 20240520"});
  const std::string m = shard_error(path);
  EXPECT_EQ(m.find("12345"), std::string::npos) << m;
  EXPECT_EQ(m.find("3039"), std::string::npos) << m;  // nor in hex
}

TEST(TokenShardErrors, TextFileGetsAHintThatDoesNotQuoteIt) {
  TempDir dir;
  const std::string path = dir.file("text.bin");
  const std::string text = "root:$6$secret:19000:0:99999:7:::\nFirst Citizen: hear me speak.\n";
  write_bytes(path, std::vector<uint8_t>(text.begin(), text.end()));
  expect_input_error([&] { TokenShard s(path); }, {path, "wrong magic", "expected 20240520",
                                                   "starts with text", "zerod-shards"});
  const std::string m = shard_error(path);
  for (const char* piece : {"root", "$6$", "secret", "1953460082"}) {
    EXPECT_EQ(m.find(piece), std::string::npos) << piece << " in: " << m;
  }
}

TEST(TokenShardErrors, BigEndianFileGetsAHint) {
  TempDir dir;
  const std::string path = dir.file("be.bin");
  const int32_t swapped = static_cast<int32_t>(__builtin_bswap32(20240520u));
  write_bytes(path, shard_bytes(swapped, 1, 2, {1, 2}));
  expect_input_error([&] { TokenShard s(path); }, {path, "wrong magic", "big-endian"});
}

TEST(TokenShardErrors, WrongVersion) {
  TempDir dir;
  const std::string path = dir.file("v.bin");
  write_bytes(path, shard_bytes(20240520, 7, 2, {1, 2}));
  expect_input_error([&] { TokenShard s(path); }, {path, "version", "found 7", "expected 1"});
}

TEST(TokenShardErrors, Uint32MagicWithTheUint16VersionIsNamedAsAMix) {
  TempDir dir;
  const std::string path = dir.file("mix.bin");
  write_bytes(path, shard_bytes32(20240801, 1, 2, {1, 2}));
  expect_input_error([&] { TokenShard s(path); },
                     {path, "version", "found 1", "expected 7", "uint32", "mixes the two formats"});
}

TEST(TokenShardErrors, Uint32TruncatedCountsFourBytesPerToken) {
  TempDir dir;
  const std::string path = dir.file("trunc32.bin");
  // Header claims 10 tokens (1064 bytes), file holds 10 uint16-sized tokens (1044 bytes).
  write_bytes(path, shard_bytes32(20240801, 7, 10, std::vector<uint32_t>(5, 3)));
  expect_input_error([&] { TokenShard s(path); },
                     {path, "truncated", "10 tokens", "expected 1064 bytes", "4 bytes per uint32",
                      "found 1044 bytes"});
}

TEST(TokenShardErrors, ZeroTokens) {
  TempDir dir;
  const std::string path = dir.file("zero.bin");
  write_bytes(path, shard_bytes(20240520, 1, 0, {}));
  expect_input_error([&] { TokenShard s(path); }, {path, "no tokens", "at least 1"});
}

TEST(TokenShardErrors, NegativeCount) {
  TempDir dir;
  const std::string path = dir.file("neg.bin");
  write_bytes(path, shard_bytes(20240520, 1, -4, {}));
  expect_input_error([&] { TokenShard s(path); }, {path, "negative", "-4"});
}

TEST(TokenShardErrors, TruncatedPayloadSaysExpectedAndFoundBytes) {
  TempDir dir;
  const std::string path = dir.file("trunc.bin");
  // Header claims 100 tokens (1224 bytes), file holds 60 (1144 bytes).
  write_bytes(path, shard_bytes(20240520, 1, 100, std::vector<uint16_t>(60, 3)));
  expect_input_error([&] { TokenShard s(path); },
                     {path, "truncated", "100 tokens", "expected 1224 bytes", "found 1144 bytes"});
}

TEST(TokenShardErrors, TrailingBytes) {
  TempDir dir;
  const std::string path = dir.file("long.bin");
  auto bytes = shard_bytes(20240520, 1, 4, {1, 2, 3, 4});
  bytes.push_back(0);
  bytes.push_back(0);
  bytes.push_back(0);
  write_bytes(path, bytes);
  expect_input_error([&] { TokenShard s(path); },
                     {path, "3 trailing bytes", "expected 1032 bytes", "found 1035 bytes"});
}

TEST(ExpandGlobs, SortedAndDeduplicated) {
  TempDir dir;
  for (const char* name : {"b_001.bin", "a_002.bin", "a_001.bin", "other.txt"})
    write_bytes(dir.file(name), {1});
  const std::string d = dir.path().string();
  const auto files = expand_globs({d + "/b_*.bin", d + "/a_*.bin", d + "/a_001.bin"}, "data.train");
  ASSERT_EQ(files.size(), 3u);
  EXPECT_EQ(files[0], d + "/a_001.bin");
  EXPECT_EQ(files[1], d + "/a_002.bin");
  EXPECT_EQ(files[2], d + "/b_001.bin");
  EXPECT_TRUE(expand_globs({}, "data.val").empty());
}

TEST(ExpandGlobs, PatternWithoutMatchNamesPatternAndKey) {
  TempDir dir;
  write_bytes(dir.file("train_000.bin"), {1});
  const std::string pattern = dir.file("val_*.bin");
  expect_input_error(
      [&] {
        expand_globs({dir.file("train_*.bin"), pattern}, "data.val");
      },
      {"data.val", pattern, "no file matches"});
}

TEST(ExpandGlobs, MissingDirectoryIsNamed) {
  TempDir dir;
  const std::string pattern = dir.file("missing_dir") + "/train_*.bin";
  expect_input_error([&] { expand_globs({pattern}, "data.train"); },
                     {"data.train", pattern, "missing_dir' does not exist"});
}

}  // namespace
}  // namespace zerod
