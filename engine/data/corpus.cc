#include "engine/data/corpus.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <system_error>

#include "core/error.h"
#include "engine/data/shard.h"

namespace zerod {

namespace {

constexpr int64_t kMaxShardIndex = 999999;  // six digits keep names sorted

bool valid_prefix(const std::string& prefix) {
  if (prefix.empty()) return false;
  return std::all_of(prefix.begin(), prefix.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

// True for "PREFIX_train_NNNNNN.bin" / "PREFIX_val_NNNNNN.bin" (six or more digits).
bool is_corpus_shard_name(const std::string& name, const std::string& prefix) {
  for (const char* split : {"_train_", "_val_"}) {
    const std::string head = prefix + split;
    if (name.size() < head.size() + 6 + 4 || name.compare(0, head.size(), head) != 0) continue;
    if (name.compare(name.size() - 4, 4, ".bin") != 0) continue;
    const std::string digits = name.substr(head.size(), name.size() - 4 - head.size());
    if (std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return true;
  }
  return false;
}

// Writes source[0, n) as shards of `split` whose tokens are `Token`; appends them to `out`.
template <typename Token, typename Source>
void write_split(std::span<const Source> source, const std::filesystem::path& dir,
                 const std::string& prefix, const std::string& split, int64_t shard_tokens,
                 CorpusShards& out) {
  std::vector<Token> tokens;
  const int64_t n = static_cast<int64_t>(source.size());
  for (int64_t start = 0, index = 0; start < n; start += shard_tokens, ++index) {
    const int64_t count = std::min(shard_tokens, n - start);
    tokens.assign(source.begin() + start, source.begin() + start + count);
    const std::string path = (dir / shard_file_name(prefix, split, index)).string();
    write_shard(path, std::span<const Token>(tokens));
    out.shards.push_back({path, split, count});
  }
}

// The shared body of write_text_shards and write_token_shards: checks the arguments, splits the
// last val_fraction of `source` off as validation, writes both splits as `Token` shards and
// removes stale shards of an earlier run. `unit` names the elements in messages.
template <typename Token, typename Source>
CorpusShards write_shards(std::span<const Source> source, const std::string& out_dir,
                          double val_fraction, int64_t shard_tokens, const std::string& prefix,
                          const char* unit);

}  // namespace

std::string shard_file_name(const std::string& prefix, const std::string& split, int64_t index) {
  return fmt::format("{}_{}_{:06d}.bin", prefix, split, index);
}

CorpusShards write_text_shards(std::span<const uint8_t> bytes, const std::string& out_dir,
                               double val_fraction, int64_t shard_tokens,
                               const std::string& prefix) {
  if (bytes.empty()) ZD_THROW_INPUT("no text to write as shards: the input is empty (0 bytes)");
  return write_shards<uint16_t>(bytes, out_dir, val_fraction, shard_tokens, prefix, "bytes");
}

CorpusShards write_token_shards(std::span<const uint32_t> tokens, int64_t vocab_size,
                                const std::string& out_dir, double val_fraction,
                                int64_t shard_tokens, const std::string& prefix) {
  if (tokens.empty()) ZD_THROW_INPUT("no tokens to write as shards: the input gave 0 tokens");
  ZD_CHECK(vocab_size >= 1, "write_token_shards: vocab_size {}", vocab_size);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (static_cast<int64_t>(tokens[i]) >= vocab_size) {
      ZD_THROW_INPUT("token {} at position {} is outside the vocabulary (vocab_size {})", tokens[i],
                     i, vocab_size);
    }
  }
  if (vocab_size <= kShardU16MaxVocab)
    return write_shards<uint16_t>(tokens, out_dir, val_fraction, shard_tokens, prefix, "tokens");
  return write_shards<uint32_t>(tokens, out_dir, val_fraction, shard_tokens, prefix, "tokens");
}

namespace {

template <typename Token, typename Source>
CorpusShards write_shards(std::span<const Source> bytes, const std::string& out_dir,
                          double val_fraction, int64_t shard_tokens, const std::string& prefix,
                          const char* unit) {
  if (!(val_fraction >= 0.0 && val_fraction < 1.0))
    ZD_THROW_INPUT("val_fraction: found {}, expected a number in [0, 1)", val_fraction);
  if (shard_tokens < 1 || shard_tokens > kShardMaxTokens)
    ZD_THROW_INPUT("shard_tokens: found {}, expected 1 .. {}", shard_tokens, kShardMaxTokens);
  if (!valid_prefix(prefix)) {
    ZD_THROW_INPUT("shard prefix '{}': expected a non-empty name of letters, digits, '.', '_', '-'",
                   prefix);
  }
  if (out_dir.empty()) ZD_THROW_INPUT("output directory: expected a path, found an empty string");

  const int64_t n = static_cast<int64_t>(bytes.size());
  int64_t n_val = 0;
  if (val_fraction > 0.0) {
    const double exact = val_fraction * static_cast<double>(n);
    n_val =
        std::max<int64_t>(1, static_cast<int64_t>(std::ceil(exact - 1e-9 * std::max(1.0, exact))));
  }
  if (n_val >= n) {
    ZD_THROW_INPUT(
        "val_fraction {} of {} {} holds out {} {} and leaves no training text; expected a "
        "smaller fraction or more text",
        val_fraction, n, unit, n_val, unit);
  }
  const int64_t n_train = n - n_val;
  const int64_t train_shards = (n_train + shard_tokens - 1) / shard_tokens;
  const int64_t val_shards = (n_val + shard_tokens - 1) / shard_tokens;
  if (std::max(train_shards, val_shards) - 1 > kMaxShardIndex) {
    ZD_THROW_INPUT(
        "shard_tokens {} would split {} {} into {} shards, more than {}; expected a "
        "larger shard_tokens",
        shard_tokens, n, unit, std::max(train_shards, val_shards), kMaxShardIndex + 1);
  }

  const std::filesystem::path dir(out_dir);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) ZD_THROW_INPUT("cannot create output directory '{}': {}", out_dir, ec.message());
  if (!std::filesystem::is_directory(dir, ec))
    ZD_THROW_INPUT("output directory '{}' is not a directory", out_dir);

  CorpusShards out;
  write_split<Token>(bytes.first(static_cast<size_t>(n_train)), dir, prefix, "train", shard_tokens,
                     out);
  write_split<Token>(bytes.subspan(static_cast<size_t>(n_train)), dir, prefix, "val", shard_tokens,
                     out);
  out.train_tokens = n_train;
  out.val_tokens = n_val;

  // Delete shards of an earlier, larger run under the same names.
  std::vector<std::string> written;
  for (const WrittenShard& s : out.shards)
    written.push_back(std::filesystem::path(s.path).filename().string());
  std::vector<std::filesystem::path> stale;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (is_corpus_shard_name(name, prefix) &&
        std::find(written.begin(), written.end(), name) == written.end())
      stale.push_back(entry.path());
  }
  std::sort(stale.begin(), stale.end());
  for (const auto& path : stale) {
    std::filesystem::remove(path, ec);
    if (ec) ZD_THROW_INPUT("cannot remove stale shard '{}': {}", path.string(), ec.message());
    out.removed.push_back(path.string());
  }
  return out;
}

}  // namespace

}  // namespace zerod
