// Training samples over a list of token shards.
//
// A sample is a window of seq_len + 1 consecutive tokens of one shard: inputs are its first
// seq_len tokens, targets its last seq_len (the next token at each position). Windows start
// every seq_len tokens (sample k of a shard starts at token k * seq_len), so consecutive
// samples share exactly one token, and a window never crosses a shard boundary: a shard of n
// tokens gives (n - 1) / seq_len samples, none when n < seq_len + 1. Samples are numbered
// shard by shard in the order the shards were given (expand_globs sorts them by name).
//
// A TokenDataset is a cheap, copyable handle: copies and subset() views share the mapped
// shards. Reads are const and thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/data/shard.h"

namespace zerod {

class TokenDataset {
 public:
  // Opens and validates every shard of `paths` (TokenShard's errors). `what` names the data in
  // messages (the config key, e.g. "data.train"). Throws InputError when `paths` is empty or
  // the shards give no sample (all shorter than seq_len + 1 tokens), or when a shard holds a
  // token >= vocab_size (the message names the shard, the first such token, its position and
  // vocab_size). The check uses each shard's max_token(), so it costs one pass per shard here
  // and nothing for copies, subset() views or reads.
  TokenDataset(const std::vector<std::string>& paths, int64_t seq_len, int64_t vocab_size,
               std::string what = "data");

  int64_t num_samples() const { return end_ - begin_; }
  int64_t seq_len() const { return seq_len_; }
  int64_t vocab_size() const { return vocab_size_; }
  const std::string& what() const { return what_; }
  // Shards and tokens of the underlying files (a subset view reports its parent's).
  int64_t num_shards() const;
  int64_t num_tokens() const;
  const TokenShard& shard(int64_t i) const;
  // The index of shard i's first sample in the underlying files' numbering (i = num_shards():
  // all their samples).
  int64_t shard_first_sample(int64_t i) const;

  // Where sample `index` (0 <= index < num_samples()) starts: a shard and a token offset in it.
  struct Location {
    int64_t shard = 0;
    int64_t token = 0;
  };
  Location locate(int64_t index) const;

  // inputs (seq_len) = window[0, seq_len), targets (seq_len) = window[1, seq_len + 1), both
  // overwritten. Every token is < vocab_size (checked when the dataset was opened); a token
  // >= vocab_size here (the file changed on disk since) throws InputError naming the shard
  // and token position.
  void read_sample(int64_t index, int32_t* inputs, int32_t* targets) const;

  // A view of this dataset's samples [begin, end), renumbered from 0, named `what`.
  // Requires 0 <= begin < end <= num_samples().
  TokenDataset subset(int64_t begin, int64_t end, std::string what) const;

 private:
  struct Shards {
    std::vector<TokenShard> shards;
    std::vector<int64_t> first_sample;  // (num_shards + 1) prefix sums of samples per shard
    int64_t num_tokens = 0;
  };
  TokenDataset(std::shared_ptr<const Shards> shards, int64_t begin, int64_t end, int64_t seq_len,
               int64_t vocab_size, std::string what)
      : shards_(std::move(shards)),
        begin_(begin),
        end_(end),
        seq_len_(seq_len),
        vocab_size_(vocab_size),
        what_(std::move(what)) {}

  std::shared_ptr<const Shards> shards_;
  int64_t begin_ = 0;  // this view's samples, as indices into the shards' numbering
  int64_t end_ = 0;
  int64_t seq_len_ = 0;
  int64_t vocab_size_ = 0;
  std::string what_;
};

}  // namespace zerod
