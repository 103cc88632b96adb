// The test fixture of zerod-shards' end-to-end tests: a temporary directory holding a hand-made
// byte-level BPE tokenizer.json (tok/tokenizer.json), and the binaries' paths.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "../e2e/run_command.h"
#include "engine/data/dataset.h"
#include "engine/data/glob.h"
#include "engine/data/shard.h"
#include "engine/tokenizer/tokenizer.h"

namespace zerod {

namespace fs = std::filesystem;

using testing::run_in;
using testing::RunResult;

inline const std::string kShards = std::string(ZEROD_BINARY_DIR) + "/tools/shards/zerod-shards";
inline const std::string kZerod = std::string(ZEROD_BINARY_DIR) + "/engine/zerod";

// UTF-8 of one code point (< 0x800 is all GPT-2's byte alphabet needs).
inline std::string utf8(int cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others for 256 + n.
inline std::vector<std::string> byte_alphabet() {
  std::vector<std::string> out(256);
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    out[b] = utf8(printable ? b : 256 + extra++);
  }
  return out;
}

inline std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// A byte-level BPE: the 256 byte symbols (ids 0..255), five merges (ids 256..260) and the added
// special token <|endoftext|> (id 261): vocab_size 262. With `eos_id` above 261 the ids between
// are filler tokens no text encodes to, and <|endoftext|> is eos_id (vocab_size eos_id + 1).
inline std::string tiny_tokenizer_json(int eos_id = 261) {
  const std::vector<std::string> bytes = byte_alphabet();
  const std::string sp = bytes[' '];  // "Ġ"
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"}, {"he", "ll"}, {sp, "w"}, {"o", "r"}};
  std::string vocab = "{";
  for (int b = 0; b < 256; ++b) vocab += json_string(bytes[b]) + ": " + std::to_string(b) + ", ";
  int id = 256;
  std::string merge_list;
  for (const auto& [a, b] : merges) {
    vocab += json_string(a + b) + ": " + std::to_string(id++) + ", ";
    merge_list += (merge_list.empty() ? "" : ", ") + json_string(a + " " + b);
  }
  for (; id < eos_id; ++id)
    vocab += "\"<filler" + std::to_string(id) + ">\": " + std::to_string(id) + ", ";
  vocab += R"("<|endoftext|>": )" + std::to_string(eos_id) + "}";
  return R"({"version": "1.0", "added_tokens": [{"id": )" + std::to_string(eos_id) +
         R"(, "content": "<|endoftext|>", "special": true, "normalized": false, "lstrip": false, "rstrip": false,
      "single_word": false}],
    "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
    "post_processor": null,
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "vocab": )" +
         vocab + R"(, "merges": [)" + merge_list + "]}}";
}

class ShardsTokenizer : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!tokenizer::have_regex_support()) GTEST_SKIP() << "built without PCRE2";
    dir_ = fs::temp_directory_path() /
           ("zerod_shards_tok_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    write("tok/tokenizer.json", tiny_tokenizer_json());
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  void write(const std::string& name, const std::string& content) {
    fs::create_directories((dir_ / name).parent_path());
    std::ofstream(dir_ / name, std::ios::binary) << content;
  }
  // The tokens of every shard matching `pattern` (in name order), concatenated.
  std::vector<uint32_t> shard_tokens(const std::string& pattern, int token_bytes = 2) {
    std::vector<uint32_t> out;
    for (const std::string& path : expand_globs({(dir_ / pattern).string()}, "test")) {
      TokenShard s(path);
      EXPECT_EQ(s.token_bytes(), token_bytes) << path;
      for (int64_t i = 0; i < s.num_tokens(); ++i) out.push_back(s.token(i));
    }
    return out;
  }
  fs::path dir_;
};

}  // namespace zerod
