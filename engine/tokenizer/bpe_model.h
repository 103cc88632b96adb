// The BPE model of Hugging Face tokenizers (models/bpe): a word's characters (or, with
// byte_fallback, <0xNN> tokens for characters outside the vocabulary) merged pair by pair,
// lowest merge rank first and leftmost among equals, exactly as tokenizers' Word::merge_all.
// Shared by tokenizer.json BPE and GPT-2's vocab.json + merges.txt.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace zerod::tokenizer {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using Vocab = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

struct BpeOptions {
  bool byte_fallback = false;              // characters not in the vocabulary as <0xNN>
  std::optional<std::string> unk_token;    // else such characters are dropped
  bool fuse_unk = false;                   // consecutive unknowns as one unk
  bool ignore_merges = false;              // a word in the vocabulary is one token
  std::string continuing_subword_prefix;   // "##"-style, empty for none
  std::string end_of_word_suffix;          // "</w>"-style, empty for none
};

class BpeModel {
 public:
  // merges in rank order. what names the source for messages. Throws InputError when a merge
  // names a token (or makes one) that is not in vocab, or unk_token is not in vocab.
  BpeModel(Vocab vocab, const std::vector<std::pair<std::string, std::string>>& merges,
           BpeOptions options, std::string_view what);

  // Appends the ids of one pre-tokenized word.
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

  const Vocab& vocab() const { return vocab_; }
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // nullptr for an id not in the vocabulary.
  const std::string* id_to_token(int32_t id) const;
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }

 private:
  struct MergeInfo {
    int32_t rank;
    int32_t new_id;
  };
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;
  const MergeInfo* find_merge(int32_t a, int32_t b) const;

  Vocab vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<char> has_id_;
  std::unordered_map<uint64_t, MergeInfo> merges_;
  BpeOptions options_;
  std::optional<int32_t> unk_id_;
  std::array<int32_t, 256> byte_ids_{};  // <0xNN>, -1 where missing
  bool all_bytes_ = false;

  // Words seen before (shorter than kCacheMaxWord bytes), sharded by hash; full shards stop
  // taking words, as tokenizers' cache does.
  static constexpr size_t kCacheShards = 16, kCacheShardCapacity = 4096, kCacheMaxWord = 256;
  struct CacheShard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> words;
  };
  mutable std::array<CacheShard, kCacheShards> cache_;
};

}  // namespace zerod::tokenizer
