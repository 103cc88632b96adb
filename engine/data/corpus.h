// Text -> token shards. write_text_shards tokenizes byte by byte: every byte is one token (its
// value), so the vocabulary is the 256 byte values and any text, in any encoding, round-trips
// exactly (zerod-shards --tokenizer byte and `zerod train`'s built-in demo). write_token_shards
// writes tokens a tokenizer made (zerod-shards --tokenizer PATH).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace zerod {

inline constexpr int64_t kByteVocabSize = 256;

struct WrittenShard {
  std::string path;
  std::string split;  // "train" or "val"
  int64_t num_tokens = 0;
};

struct CorpusShards {
  std::vector<WrittenShard> shards;  // train shards in order, then val shards
  std::vector<std::string> removed;  // stale shards of an earlier run, deleted
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
};

// "PREFIX_SPLIT_NNNNNN.bin", e.g. shard_file_name("demo", "train", 3) = "demo_train_000003.bin".
std::string shard_file_name(const std::string& prefix, const std::string& split, int64_t index);

// Tokenises `bytes` byte by byte and writes out_dir/PREFIX_train_000000.bin, ... with at most
// shard_tokens tokens each (the last one shorter), and likewise PREFIX_val_*.bin for the
// validation split: the LAST ceil(val_fraction * size) bytes (none when val_fraction is 0).
// Creates out_dir. Each shard is written atomically. Shards named PREFIX_train_NNNNNN.bin or
// PREFIX_val_NNNNNN.bin already in out_dir that this call did not write (left by an earlier run
// with more shards) are deleted, so "PREFIX_train_*.bin" matches exactly this corpus.
// InputErrors: empty `bytes`, val_fraction outside [0, 1) or leaving no training byte,
// shard_tokens outside [1, 2^31 - 1], a prefix that is not [A-Za-z0-9._-]+, an out_dir that
// cannot be created or written.
CorpusShards write_text_shards(std::span<const uint8_t> bytes, const std::string& out_dir,
                               double val_fraction, int64_t shard_tokens,
                               const std::string& prefix);

// The same for `tokens` already made by a tokenizer of `vocab_size` ids: the split and file
// names are those of write_text_shards, counted in tokens. The shards hold uint16 tokens when
// vocab_size <= kShardU16MaxVocab (65536), else uint32 (shard.h). InputErrors as
// write_text_shards, and for a token >= vocab_size.
CorpusShards write_token_shards(std::span<const uint32_t> tokens, int64_t vocab_size,
                                const std::string& out_dir, double val_fraction,
                                int64_t shard_tokens, const std::string& prefix);

}  // namespace zerod
