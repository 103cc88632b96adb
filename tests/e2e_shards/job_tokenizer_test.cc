// A job's data.tokenizer end to end with the zerod binary: checked against the model at the
// start (exit 2 naming data.tokenizer), copied into every checkpoint (with a tokenizer_config.json
// made for transformers), used by `zerod generate --prompt` and `zerod eval`'s sample from the
// checkpoint alone, checked against its CRC32C there, and copied into `zeroctl export`'s
// directory. (tests/hf/tokenizer_roundtrip.py loads that directory with AutoTokenizer.)
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "tests/e2e_shards/shards_fixture.h"

namespace zerod {
namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

const std::string kZeroctl = std::string(ZEROD_BINARY_DIR) + "/tools/zeroctl/zeroctl";

std::string job(int vocab, const std::string& tokenizer) {
  return R"({"train_micro_batch_size_per_gpu": 4, "steps_per_print": 1,
      "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": )" +
         std::to_string(vocab) + R"(, "seq_len": 16},
      "data": {"train": "data/c_train_*.bin", "val": "data/c_val_*.bin", "tokenizer": ")" +
         tokenizer + R"("},
      "train": {"steps": 4, "checkpoint_dir": "ckpt", "save_interval": 4}})";
}

class JobTokenizer : public ShardsTokenizer {
 protected:
  void SetUp() override {
    ShardsTokenizer::SetUp();
    if (IsSkipped()) return;
    std::string jsonl;
    for (int i = 0; i < 200; ++i)
      jsonl += R"({"text": "hello world )" + std::to_string(i) + R"( or hell"})" + "\n";
    write("c.jsonl", jsonl);
    const RunResult r = run_in(dir_, kShards,
                               "--tokenizer tok --jsonl --append-eos --prefix c --val-fraction 0.1 "
                               "--out-dir data c.jsonl");
    ASSERT_EQ(r.code, 0) << r.output;
  }
};

TEST_F(JobTokenizer, GoesIntoCheckpointsAndServesGenerateEvalAndExport) {
  write("job.json", job(262, "tok/tokenizer.json"));
  const RunResult t = run_in(dir_, kZerod, "train job.json");
  ASSERT_EQ(t.code, 0) << t.output;
  const fs::path ck = dir_ / "ckpt" / "global_step4";
  ASSERT_TRUE(fs::exists(ck / "tokenizer" / "tokenizer.json")) << t.output;
  EXPECT_EQ(read_file(ck / "tokenizer" / "tokenizer.json"),
            read_file(dir_ / "tok" / "tokenizer.json"));
  const auto config = nlohmann::json::parse(read_file(ck / "tokenizer" / "tokenizer_config.json"));
  EXPECT_EQ(config["tokenizer_class"], "PreTrainedTokenizerFast");
  EXPECT_EQ(config["eos_token"], "<|endoftext|>");
  EXPECT_EQ(config["model_max_length"], 16);
  const auto manifest = nlohmann::json::parse(read_file(ck / "manifest.json"));
  EXPECT_EQ(manifest["tokenizer"]["files"].size(), 2u);
  EXPECT_TRUE(manifest["job"]["data"].contains("tokenizer"));

  // generate --prompt: the checkpoint's tokenizer, no --tokenizer needed.
  const RunResult g =
      run_in(dir_, kZerod, "generate --from ckpt --prompt \"hello world\" --max-new-tokens 4");
  ASSERT_EQ(g.code, 0) << g.output;
  EXPECT_NE(g.output.find("tokenizer tokenizer.json"), std::string::npos) << g.output;

  // eval prints a sample decoded with it.
  const RunResult e = run_in(dir_, kZerod, "eval job.json --sample-tokens 4");
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_NE(e.output.find("sample (tokenizer.json"), std::string::npos) << e.output;
  EXPECT_NE(e.output.find("[["), std::string::npos) << e.output;
  const RunResult quiet = run_in(dir_, kZerod, "eval job.json --sample-tokens 0");
  ASSERT_EQ(quiet.code, 0) << quiet.output;
  EXPECT_EQ(quiet.output.find("sample ("), std::string::npos) << quiet.output;

  // export copies tokenizer.json and tokenizer_config.json beside the weights.
  if (fs::exists(kZeroctl)) {
    const RunResult x = run_in(dir_, kZeroctl, "export ckpt --out hf");
    ASSERT_EQ(x.code, 0) << x.output;
    EXPECT_EQ(read_file(dir_ / "hf" / "tokenizer.json"),
              read_file(dir_ / "tok" / "tokenizer.json"));
    EXPECT_TRUE(fs::exists(dir_ / "hf" / "tokenizer_config.json"));
    EXPECT_TRUE(fs::exists(dir_ / "hf" / "model.safetensors"));
  }

  // A damaged tokenizer file in the checkpoint is found by its CRC32C, not used.
  std::string bytes = read_file(ck / "tokenizer" / "tokenizer.json");
  bytes[bytes.size() / 2] = bytes[bytes.size() / 2] == 'a' ? 'b' : 'a';
  std::ofstream(ck / "tokenizer" / "tokenizer.json", std::ios::binary) << bytes;
  const RunResult bad =
      run_in(dir_, kZerod,
             "generate --from ckpt --tag global_step4 --prompt \"hello\" --max-new-tokens 2");
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_NE(bad.output.find("tokenizer/tokenizer.json"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("corrupt"), std::string::npos) << bad.output;
}

// data.document_masking takes its EOS id from data.tokenizer when data.eos_token_id is absent.
TEST_F(JobTokenizer, DocumentMaskingTakesTheTokenizersEos) {
  std::string masked = job(262, "tok");
  masked.replace(masked.find("\"tokenizer\""), 0, "\"document_masking\": true, ");
  write("masked.json", masked);
  const RunResult t = run_in(dir_, kZerod, "train masked.json");
  ASSERT_EQ(t.code, 0) << t.output;
  EXPECT_NE(t.output.find("step 4/4"), std::string::npos) << t.output;
  // Without a tokenizer the id is required.
  write("bare.json", R"({"train_micro_batch_size_per_gpu": 4,
      "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 262, "seq_len": 16},
      "data": {"train": "data/c_train_*.bin", "document_masking": true}, "train": {"steps": 1}})");
  const RunResult bare = run_in(dir_, kZerod, "train bare.json");
  EXPECT_EQ(bare.code, 2) << bare.output;
  EXPECT_NE(bare.output.find("data.eos_token_id: required"), std::string::npos) << bare.output;
}

TEST_F(JobTokenizer, BadTokenizerStopsTheJobNamingTheKey) {
  write("small.json", job(256, "tok/tokenizer.json"));
  const RunResult small = run_in(dir_, kZerod, "train small.json");
  EXPECT_EQ(small.code, 2) << small.output;
  EXPECT_NE(small.output.find("data.tokenizer"), std::string::npos) << small.output;
  EXPECT_NE(small.output.find("model.vocab_size 256"), std::string::npos) << small.output;
  EXPECT_FALSE(fs::exists(dir_ / "ckpt" / "latest"));
  const RunResult check = run_in(dir_, kZerod, "check small.json");  // zerod check finds it too
  EXPECT_EQ(check.code, 2) << check.output;
  EXPECT_NE(check.output.find("data.tokenizer"), std::string::npos) << check.output;

  write("missing.json", job(262, "nowhere/tokenizer.json"));
  const RunResult missing = run_in(dir_, kZerod, "train missing.json");
  EXPECT_EQ(missing.code, 2) << missing.output;
  EXPECT_NE(missing.output.find("data.tokenizer"), std::string::npos) << missing.output;
  EXPECT_NE(missing.output.find("nowhere/tokenizer.json"), std::string::npos) << missing.output;

  write("notes.txt", "just text");
  write("text.json", job(262, "notes.txt"));
  const RunResult text = run_in(dir_, kZerod, "train text.json");
  EXPECT_EQ(text.code, 2) << text.output;
  EXPECT_NE(text.output.find("data.tokenizer"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("supported"), std::string::npos) << text.output;
}

}  // namespace
}  // namespace zerod
