// zerod-shards --tokenizer end to end: a hand-made byte-level BPE tokenizer.json, a JSONL corpus
// encoded into shards (each record's ids + EOS, exactly the tokenizer's encode()), `zerod train`
// on them, and bad JSONL lines (exit 2 naming file:line, or skipped with --skip-bad-lines).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/e2e_shards/shards_fixture.h"

namespace zerod {
namespace {

TEST_F(ShardsTokenizer, JsonlWithEosEqualsEncodeAndTrains) {
  const auto tok = tokenizer::load_tokenizer(dir_ / "tok" / "tokenizer.json");
  ASSERT_EQ(tok->vocab_size(), 262);
  ASSERT_EQ(tok->eos_id(), 261);
  std::vector<std::string> texts;
  for (int i = 0; i < 300; ++i) {
    texts.push_back("hello world " + std::to_string(i) + ", or hell \"quoted\" é\n" +
                    std::string(static_cast<size_t>(i % 7), 'l'));
  }
  std::string jsonl;
  std::vector<uint32_t> expected;
  for (const std::string& t : texts) {
    std::string esc;
    for (char c : t) {
      if (c == '\n')
        esc += "\\n";
      else if (c == '"')
        esc += "\\\"";
      else
        esc += c;
    }
    jsonl += R"({"id": 1, "text": ")" + esc + "\"}\n";
    for (int32_t id : tok->encode(t)) expected.push_back(static_cast<uint32_t>(id));
    expected.push_back(261);
  }
  // The merges fire ("hell", "Ġw", "or"), so the shards hold more than byte ids.
  EXPECT_TRUE(std::any_of(expected.begin(), expected.end(),
                          [](uint32_t id) { return id >= 256 && id < 261; }));
  write("corpus.jsonl", jsonl);

  const std::string args =
      "--tokenizer tok/tokenizer.json --jsonl --text-key text --append-eos --prefix c "
      "--val-fraction 0.1 --shard-tokens 3000 corpus.jsonl --out-dir ";
  const RunResult r = run_in(dir_, kShards, args + "data");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("300 document(s)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("vocab_size 262"), std::string::npos) << r.output;

  std::vector<uint32_t> got = shard_tokens("data/c_train_*.bin");
  const std::vector<uint32_t> val = shard_tokens("data/c_val_*.bin");
  EXPECT_FALSE(val.empty());
  got.insert(got.end(), val.begin(), val.end());
  EXPECT_EQ(got, expected);
  for (const auto& e : fs::directory_iterator(dir_ / "data")) {  // no temporary left behind
    EXPECT_TRUE(e.path().extension() == ".bin" || e.path().filename() == "c_manifest.json")
        << e.path();
  }

  // Deterministic: a second run (one thread) writes the same bytes, manifest included.
  const RunResult again = run_in(dir_, kShards, "--threads 1 " + args + "data1");
  ASSERT_EQ(again.code, 0) << again.output;
  for (const auto& e : fs::directory_iterator(dir_ / "data")) {
    std::ifstream a(e.path(), std::ios::binary),
        b(dir_ / "data1" / e.path().filename(), std::ios::binary);
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(a), {}),
              std::string(std::istreambuf_iterator<char>(b), {}))
        << e.path();
  }

  write("job.json", R"({"train_micro_batch_size_per_gpu": 4,
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
      "steps_per_print": 1,
      "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 262, "seq_len": 16},
      "data": {"train": "data/c_train_*.bin", "val": "data/c_val_*.bin"},
      "train": {"steps": 4, "eval_interval": 4, "eval_batches": 1}})");
  const RunResult t = run_in(dir_, kZerod, "train job.json");
  ASSERT_EQ(t.code, 0) << t.output;
  EXPECT_NE(t.output.find("step 4/4"), std::string::npos) << t.output;

  // A model vocabulary smaller than the tokenizer's is refused at job start, naming the shard.
  write("small.json", R"({"train_micro_batch_size_per_gpu": 4,
      "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 256, "seq_len": 16},
      "data": {"train": "data/c_train_*.bin"}, "train": {"steps": 1}})");
  const RunResult small = run_in(dir_, kZerod, "train small.json");
  EXPECT_EQ(small.code, 2) << small.output;
  EXPECT_NE(small.output.find("c_train_000000.bin"), std::string::npos) << small.output;
}

// A vocabulary above 65536 gives uint32 shards (llm.c's magic 20240801), which a Llama model of
// that vocabulary trains on.
TEST_F(ShardsTokenizer, LargeVocabularyWritesUint32ShardsThatTrain) {
  write("big/tokenizer.json", tiny_tokenizer_json(70000));
  const auto tok = tokenizer::load_tokenizer(dir_ / "big" / "tokenizer.json");
  ASSERT_EQ(tok->vocab_size(), 70001);
  ASSERT_EQ(tok->eos_id(), 70000);
  std::string jsonl;
  std::vector<uint32_t> expected;
  for (int i = 0; i < 60; ++i) {
    const std::string t = "hello world, or hell " + std::to_string(i);
    jsonl += R"({"text": ")" + t + "\"}\n";
    for (int32_t id : tok->encode(t)) expected.push_back(static_cast<uint32_t>(id));
    expected.push_back(70000);
  }
  write("big.jsonl", jsonl);
  const RunResult r = run_in(dir_, kShards,
                             "--tokenizer big --jsonl --append-eos --val-fraction 0 --out-dir data "
                             "--prefix w big.jsonl");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("vocab_size 70001, uint32 tokens"), std::string::npos) << r.output;
  EXPECT_EQ(shard_tokens("data/w_train_*.bin", 4), expected);
  std::ifstream shard(dir_ / "data" / "w_train_000000.bin", std::ios::binary);
  std::array<int32_t, 3> header{};
  shard.read(reinterpret_cast<char*>(header.data()), sizeof(header));
  EXPECT_EQ(header[0], 20240801);
  EXPECT_EQ(header[1], 7);
  EXPECT_EQ(header[2], static_cast<int32_t>(expected.size()));

  write("job.json", R"({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
      "model": {"type": "llama", "hidden_size": 16, "intermediate_size": 32,
                "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
                "vocab_size": 70001, "seq_len": 16},
      "data": {"train": "data/w_train_*.bin"}, "train": {"steps": 2}})");
  const RunResult t = run_in(dir_, kZerod, "train job.json");
  ASSERT_EQ(t.code, 0) << t.output;
  EXPECT_NE(t.output.find("step 2/2"), std::string::npos) << t.output;
}

TEST_F(ShardsTokenizer, TextFilesAreDocuments) {
  const auto tok = tokenizer::load_tokenizer(dir_ / "tok" / "tokenizer.json");
  write("a.txt", "hello world\n");
  write("b.txt", "or hell");
  const RunResult r = run_in(dir_, kShards,
                             "--tokenizer tok --append-eos --val-fraction 0 --out-dir data "
                             "--prefix t a.txt b.txt");
  ASSERT_EQ(r.code, 0) << r.output;
  std::vector<uint32_t> expected;
  for (const char* t : {"hello world\n", "or hell"}) {
    for (int32_t id : tok->encode(t)) expected.push_back(static_cast<uint32_t>(id));
    expected.push_back(261);
  }
  EXPECT_EQ(shard_tokens("data/t_train_*.bin"), expected);
}

TEST_F(ShardsTokenizer, BadJsonlLineNamesFileAndLineOrIsSkipped) {
  write("bad.jsonl",
        "{\"text\": \"hello\"}\n\n{\"text\": \"world\"\n{\"body\": \"x\"}\n{\"text\": 7}\n"
        "{\"text\": \"or\"}\n");
  const RunResult r = run_in(dir_, kShards,
                             "--tokenizer tok/tokenizer.json --jsonl --out-dir data --prefix b "
                             "--val-fraction 0 bad.jsonl");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("bad.jsonl:3: not valid JSON"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--skip-bad-lines"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir_ / "data" / "b_train_000000.bin"));

  const RunResult s = run_in(dir_, kShards,
                             "--tokenizer tok/tokenizer.json --jsonl --skip-bad-lines --append-eos "
                             "--out-dir data --prefix b --val-fraction 0 bad.jsonl");
  ASSERT_EQ(s.code, 0) << s.output;
  EXPECT_NE(s.output.find("skipped bad.jsonl:3: not valid JSON"), std::string::npos) << s.output;
  EXPECT_NE(s.output.find("bad.jsonl:4: no \"text\" member"), std::string::npos) << s.output;
  EXPECT_NE(s.output.find("bad.jsonl:5: \"text\" is a JSON number"), std::string::npos) << s.output;
  EXPECT_NE(s.output.find("3 bad line(s) skipped"), std::string::npos) << s.output;
  const auto tok = tokenizer::load_tokenizer(dir_ / "tok");
  std::vector<uint32_t> expected;
  for (const char* t : {"hello", "or"}) {
    for (int32_t id : tok->encode(t)) expected.push_back(static_cast<uint32_t>(id));
    expected.push_back(261);
  }
  EXPECT_EQ(shard_tokens("data/b_train_*.bin"), expected);
}

TEST_F(ShardsTokenizer, RefusesEosWithTheByteTokenizer) {
  write("a.txt", "hello");
  const RunResult r = run_in(dir_, kShards, "--append-eos a.txt");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("no EOS"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace zerod
