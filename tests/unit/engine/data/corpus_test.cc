// write_text_shards (byte-level tokenisation) and the zerod-shards tool.
#include "engine/data/corpus.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "data_test_util.h"
#include "engine/data/glob.h"
#include "engine/data/shard.h"

namespace zerod {
namespace {

using testing::expect_input_error;
using testing::TempDir;

std::vector<uint8_t> sample_text(size_t n) {
  std::vector<uint8_t> bytes(n);
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>((i * 131 + i / 7) % 256);
  return bytes;
}

// Concatenated tokens of the shards matching `pattern`, in name order.
std::vector<uint8_t> read_back(const std::string& pattern, int64_t* files = nullptr) {
  std::vector<uint8_t> out;
  const auto paths = expand_globs({pattern}, "test");
  for (const std::string& p : paths) {
    TokenShard shard(p);
    for (int64_t i = 0; i < shard.num_tokens(); ++i) {
      EXPECT_LT(shard.tokens()[i], 256) << p;
      out.push_back(static_cast<uint8_t>(shard.tokens()[i]));
    }
  }
  if (files) *files = static_cast<int64_t>(paths.size());
  return out;
}

TEST(Corpus, ShardsReadBackToTheInputBytes) {
  TempDir dir;
  const auto text = sample_text(10'007);
  const std::string out = dir.file("sub/dir");  // created
  const CorpusShards r = write_text_shards(text, out, 0.1, 1000, "demo");
  // val = the last ceil(0.1 * 10007) = 1001 bytes.
  EXPECT_EQ(r.val_tokens, 1001);
  EXPECT_EQ(r.train_tokens, 10'007 - 1001);
  int64_t train_files = 0, val_files = 0;
  const auto train = read_back(out + "/demo_train_*.bin", &train_files);
  const auto val = read_back(out + "/demo_val_*.bin", &val_files);
  EXPECT_EQ(train_files, 10);  // 9006 tokens in shards of 1000
  EXPECT_EQ(val_files, 2);     // 1001 tokens
  std::vector<uint8_t> joined = train;
  joined.insert(joined.end(), val.begin(), val.end());
  EXPECT_EQ(joined, text);
  EXPECT_EQ(train.size(), 9006u);
  ASSERT_EQ(r.shards.size(), 12u);
  EXPECT_EQ(r.shards.front().path, out + "/demo_train_000000.bin");
  EXPECT_EQ(r.shards.back().path, out + "/demo_val_000001.bin");
  EXPECT_EQ(r.shards.back().num_tokens, 1);
  EXPECT_TRUE(r.removed.empty());
}

TEST(Corpus, NoValidationWhenFractionIsZero) {
  TempDir dir;
  const auto text = sample_text(500);
  const CorpusShards r = write_text_shards(text, dir.path().string(), 0.0, 1 << 20, "x");
  EXPECT_EQ(r.val_tokens, 0);
  EXPECT_EQ(read_back(dir.file("x_train_*.bin")), text);
  EXPECT_FALSE(std::filesystem::exists(dir.file("x_val_000000.bin")));
}

TEST(Corpus, RewritingRemovesStaleShardsOfTheSamePrefixOnly) {
  TempDir dir;
  const std::string out = dir.path().string();
  write_text_shards(sample_text(5000), out, 0.2, 500, "p");   // 8 train + 2 val shards
  testing::write_bytes(dir.file("p_train_notes.bin"), {1});   // not our name pattern
  testing::write_bytes(dir.file("q_train_000007.bin"), {1});  // another prefix
  const auto text = sample_text(1200);
  const CorpusShards r = write_text_shards(text, out, 0.0, 500, "p");  // 3 train shards
  EXPECT_EQ(r.removed.size(), 5u + 2u);
  int64_t files = 0;
  EXPECT_EQ(read_back(out + "/p_train_*[0-9].bin", &files), text);
  EXPECT_EQ(files, 3);
  EXPECT_FALSE(std::filesystem::exists(dir.file("p_val_000000.bin")));
  EXPECT_TRUE(std::filesystem::exists(dir.file("p_train_notes.bin")));
  EXPECT_TRUE(std::filesystem::exists(dir.file("q_train_000007.bin")));
}

TEST(Corpus, TokenShardsAreUint16WhenTheVocabularyFitsElseUint32) {
  TempDir dir;
  std::vector<uint32_t> tokens(100);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i * 600);
  for (const int64_t vocab : {int64_t{65536}, int64_t{128256}}) {
    const std::string prefix = "v" + std::to_string(vocab);
    const CorpusShards r = write_token_shards(tokens, vocab, dir.path().string(), 0.1, 40, prefix);
    EXPECT_EQ(r.train_tokens, 90);
    EXPECT_EQ(r.val_tokens, 10);
    ASSERT_EQ(r.shards.size(), 4u);  // train 40 + 40 + 10, val 10
    std::vector<uint32_t> back;
    for (const WrittenShard& w : r.shards) {
      TokenShard s(w.path);
      EXPECT_EQ(s.token_bytes(), vocab <= 65536 ? 2 : 4) << w.path;
      for (int64_t i = 0; i < s.num_tokens(); ++i) back.push_back(s.token(i));
    }
    EXPECT_EQ(back, tokens);
  }
  expect_input_error(
      [&] { write_token_shards(tokens, 1000, dir.path().string(), 0.0, 40, "small"); },
      {"token 1200", "position 2", "vocab_size 1000"});
}

TEST(Corpus, BadArguments) {
  TempDir dir;
  const std::string out = dir.path().string();
  const auto text = sample_text(100);
  expect_input_error([&] { write_text_shards({}, out, 0.1, 10, "a"); }, {"empty"});
  expect_input_error([&] { write_text_shards(text, out, 1.0, 10, "a"); },
                     {"val_fraction", "found 1"});
  expect_input_error([&] { write_text_shards(text, out, -0.5, 10, "a"); }, {"found -0.5"});
  expect_input_error([&] { write_text_shards(text, out, 0.1, 0, "a"); },
                     {"shard_tokens", "found 0"});
  expect_input_error([&] { write_text_shards(text, out, 0.1, 10, "a/b"); }, {"prefix 'a/b'"});
  expect_input_error([&] { write_text_shards(std::vector<uint8_t>{1}, out, 0.5, 10, "a"); },
                     {"no training text"});
  testing::write_bytes(dir.file("file"), {1});
  expect_input_error([&] { write_text_shards(text, dir.file("file") + "/sub", 0.1, 10, "a"); },
                     {"cannot create output directory", "file/sub"});
}

// ---- the zerod-shards tool ------------------------------------------------------------------

struct RunResult {
  int exit_code = -1;
  std::string output;
};

// Runs zerod-shards with `args` (each single-quoted), capturing stdout and stderr.
RunResult run_tool(const TempDir& dir, const std::vector<std::string>& args) {
  const std::string log = dir.file("tool.log");
  std::string cmd = fmt::format("'{}/tools/shards/zerod-shards'", ZEROD_BINARY_DIR);
  for (const std::string& a : args) cmd += fmt::format(" '{}'", a);
  cmd += fmt::format(" > '{}' 2>&1", log);
  const int status = std::system(cmd.c_str());
  RunResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(log);
  std::stringstream ss;
  ss << in.rdbuf();
  r.output = ss.str();
  return r;
}

class ShardsTool : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(std::string(ZEROD_BINARY_DIR) + "/tools/shards/zerod-shards"))
      GTEST_SKIP() << "zerod-shards is not built";
  }
};

TEST_F(ShardsTool, ConcatenatesFilesWithNewlinesAndWritesShards) {
  TempDir dir;
  testing::write_bytes(dir.file("a.txt"), {'a', 'b', 'c'});   // no final newline: one added
  testing::write_bytes(dir.file("b.txt"), {'d', 'e', '\n'});  // ends in one: kept as is
  testing::write_bytes(dir.file("c.txt"), {'f', 'g', 'h', 'i', 'j', 'k', 'l', '\n'});
  const std::string out = dir.file("out");
  const RunResult r = run_tool(dir, {"--out-dir", out, "--val-fraction", "0.2", "--shard-tokens",
                                     "5", dir.file("a.txt"), dir.file("b.txt"), dir.file("c.txt")});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string expected = "abc\nde\nfghijkl\n";     // 15 bytes: 12 train, 3 val
  const auto train = read_back(out + "/a_train_*.bin");  // prefix from the first file
  const auto val = read_back(out + "/a_val_*.bin");
  EXPECT_EQ(std::string(train.begin(), train.end()), expected.substr(0, 12));
  EXPECT_EQ(std::string(val.begin(), val.end()), expected.substr(12));
  EXPECT_NE(r.output.find("a_train_000002.bin"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("vocab_size 256"), std::string::npos) << r.output;
}

TEST_F(ShardsTool, BadInputExitsWithTwo) {
  TempDir dir;
  testing::write_bytes(dir.file("a.txt"), {'x', '\n'});
  const std::string a = dir.file("a.txt"), o = dir.file("o");
  RunResult r = run_tool(dir, {"--tokenizer", "gpt2", a, "--out-dir", o});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--tokenizer 'gpt2'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("no such file or directory"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("'byte' for the built-in"), std::string::npos) << r.output;
  r = run_tool(dir, {dir.file("missing.txt"), "--out-dir", o});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("missing.txt"), std::string::npos) << r.output;
  r = run_tool(dir, {"--no-such-flag", a, "--out-dir", o});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--no-such-flag"), std::string::npos) << r.output;
  r = run_tool(dir, {"--val-fraction", "2", a, "--out-dir", o});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--val-fraction 2"), std::string::npos) << r.output;
  r = run_tool(dir, {"--out-dir", o});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("FILE is required"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(o));  // nothing was written by any failed run
}

}  // namespace
}  // namespace zerod
