#include "engine/data/dataset.h"

#include <algorithm>

#include "core/error.h"

namespace zerod {

TokenDataset::TokenDataset(const std::vector<std::string>& paths, int64_t seq_len,
                           int64_t vocab_size, std::string what)
    : seq_len_(seq_len), vocab_size_(vocab_size), what_(std::move(what)) {
  ZD_CHECK(seq_len >= 1, "{}: seq_len {} must be >= 1", what_, seq_len);
  ZD_CHECK(vocab_size >= 1, "{}: vocab_size {} must be >= 1", what_, vocab_size);
  if (paths.empty())
    ZD_THROW_INPUT("{}: no shard files given; expected llm.c .bin token shards", what_);

  auto shards = std::make_shared<Shards>();
  shards->shards.reserve(paths.size());
  shards->first_sample.reserve(paths.size() + 1);
  shards->first_sample.push_back(0);
  int64_t longest = 0;
  std::string longest_path;
  for (const std::string& path : paths) {
    TokenShard& shard = shards->shards.emplace_back(path);
    const int64_t n = shard.num_tokens();
    shards->num_tokens += n;
    if (n > longest) {
      longest = n;
      longest_path = path;
    }
    shards->first_sample.push_back(shards->first_sample.back() + (n - 1) / seq_len);
    if (shard.max_token() >= vocab_size) {
      const int64_t pos = shard.first_token_at_least(vocab_size);
      ZD_THROW_INPUT(
          "{}: shard '{}' has token {} at token position {} (of {}), expected every token < "
          "vocab_size {} (model.vocab_size); the shard's largest token is {}: it was tokenized "
          "with a larger vocabulary, or model.vocab_size is too small",
          what_, path, pos >= 0 ? shard.token(pos) : shard.max_token(), pos, n, vocab_size,
          shard.max_token());
    }
  }
  if (shards->first_sample.back() == 0) {
    ZD_THROW_INPUT(
        "{}: no training sample: all {} shard(s) are shorter than seq_len + 1 = {} tokens (the "
        "longest, of {}, has {} tokens); a sample needs seq_len + 1 consecutive tokens of one "
        "shard",
        what_, paths.size(), seq_len + 1, longest_path, longest);
  }
  begin_ = 0;
  end_ = shards->first_sample.back();
  shards_ = std::move(shards);
}

int64_t TokenDataset::num_shards() const {
  return static_cast<int64_t>(shards_->shards.size());
}

int64_t TokenDataset::num_tokens() const {
  return shards_->num_tokens;
}

int64_t TokenDataset::shard_first_sample(int64_t i) const {
  ZD_CHECK(i >= 0 && i <= num_shards(), "shard {} of {}", i, num_shards());
  return shards_->first_sample[static_cast<size_t>(i)];
}

const TokenShard& TokenDataset::shard(int64_t i) const {
  ZD_CHECK(i >= 0 && i < num_shards(), "shard {} of {}", i, num_shards());
  return shards_->shards[static_cast<size_t>(i)];
}

TokenDataset::Location TokenDataset::locate(int64_t index) const {
  ZD_CHECK(index >= 0 && index < num_samples(), "{}: sample {} of {}", what_, index, num_samples());
  const int64_t global = begin_ + index;
  const auto& first = shards_->first_sample;
  // The last shard whose first sample is <= global (shards with 0 samples are skipped over).
  const auto it = std::upper_bound(first.begin(), first.end(), global);
  const int64_t shard = (it - first.begin()) - 1;
  return {shard, (global - first[static_cast<size_t>(shard)]) * seq_len_};
}

namespace {

// Copies window[0, seq_len] into inputs/targets after checking every token against the vocabulary.
template <typename T>
void copy_window(const T* window, int64_t seq_len, int64_t vocab_size, const std::string& what,
                 const TokenShard& sh, int64_t first, int32_t* inputs, int32_t* targets) {
  for (int64_t t = 0; t <= seq_len; ++t) {
    if (static_cast<int64_t>(window[t]) >= vocab_size) {
      ZD_THROW_INPUT(
          "{}: shard '{}' has token {} at token position {}, expected a token < vocab_size {} "
          "(model.vocab_size)",
          what, sh.path(), window[t], first + t, vocab_size);
    }
  }
  for (int64_t t = 0; t < seq_len; ++t) {
    inputs[t] = static_cast<int32_t>(window[t]);
    targets[t] = static_cast<int32_t>(window[t + 1]);
  }
}

}  // namespace

void TokenDataset::read_sample(int64_t index, int32_t* inputs, int32_t* targets) const {
  const Location loc = locate(index);
  const TokenShard& sh = shards_->shards[static_cast<size_t>(loc.shard)];
  if (sh.token_bytes() == 2) {
    copy_window(sh.tokens() + loc.token, seq_len_, vocab_size_, what_, sh, loc.token, inputs,
                targets);
  } else {
    copy_window(sh.tokens32() + loc.token, seq_len_, vocab_size_, what_, sh, loc.token, inputs,
                targets);
  }
}

TokenDataset TokenDataset::subset(int64_t begin, int64_t end, std::string what) const {
  ZD_CHECK(0 <= begin && begin < end && end <= num_samples(), "{}: subset [{}, {}) of {} samples",
           what_, begin, end, num_samples());
  return TokenDataset(shards_, begin_ + begin, begin_ + end, seq_len_, vocab_size_,
                      std::move(what));
}

}  // namespace zerod
