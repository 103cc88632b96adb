// One llm.c token shard (.bin): a header of 256 little-endian int32 — [0] magic, [1] version,
// [2] number of tokens — followed by exactly that many little-endian tokens, in one of the two
// widths llm.c's dev/data/data_common.py writes:
//   magic 20240520, version 1: uint16 tokens (its "gpt-2" header; vocabularies up to 65536),
//   magic 20240801, version 7: uint32 tokens (its "llama-3" header; larger vocabularies),
// so shards people already have load unchanged, and shards zerod writes load in llm.c.
//
// A TokenShard validates the file completely when it is opened (size, magic, version, count) and
// maps it read-only; any problem is an InputError naming the file, what was expected and what
// was found. Opening also scans the tokens once for their maximum (max_token()), so a
// TokenDataset can check them against the vocabulary at job start without re-reading.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace zerod {

inline constexpr int32_t kShardMagic = 20240520;  // uint16 tokens
inline constexpr int32_t kShardVersion = 1;
inline constexpr int32_t kShardMagicU32 = 20240801;  // uint32 tokens
inline constexpr int32_t kShardVersionU32 = 7;
// The largest vocabulary whose ids all fit a uint16 shard.
inline constexpr int64_t kShardU16MaxVocab = 65536;
inline constexpr int64_t kShardHeaderInts = 256;
inline constexpr int64_t kShardHeaderBytes = kShardHeaderInts * 4;
// The header stores the token count as an int32.
inline constexpr int64_t kShardMaxTokens = INT32_MAX;

class TokenShard {
 public:
  // Opens, validates and maps `path`. Throws InputError when the file is missing, unreadable,
  // not a regular file, shorter than the header, has a wrong magic or version (or a version that
  // belongs to the other magic), holds 0 tokens, or its size is not header + token_bytes() *
  // num_tokens bytes.
  explicit TokenShard(std::string path);
  ~TokenShard();

  TokenShard(TokenShard&& other) noexcept;
  TokenShard& operator=(TokenShard&& other) noexcept;
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;

  const std::string& path() const { return path_; }
  int64_t num_tokens() const { return num_tokens_; }
  // 2 (uint16 tokens, magic 20240520) or 4 (uint32 tokens, magic 20240801).
  int token_bytes() const { return token_bytes_; }
  // (num_tokens) little-endian uint16, valid while the shard lives; only for token_bytes() == 2.
  const uint16_t* tokens() const;
  // (num_tokens) little-endian uint32, valid while the shard lives; only for token_bytes() == 4.
  const uint32_t* tokens32() const;
  // Token `i` (0 <= i < num_tokens) of either width.
  uint32_t token(int64_t i) const {
    return token_bytes_ == 2 ? static_cast<const uint16_t*>(data_)[i]
                             : static_cast<const uint32_t*>(data_)[i];
  }
  // The largest token of the shard, computed once when it is opened.
  uint32_t max_token() const { return max_token_; }
  // The position of the first token >= `limit`, or -1 when there is none (a full scan).
  int64_t first_token_at_least(int64_t limit) const;

 private:
  void unmap();

  std::string path_;
  int64_t num_tokens_ = 0;
  void* map_ = nullptr;  // the whole file, PROT_READ
  size_t map_bytes_ = 0;
  const void* data_ = nullptr;  // the tokens, inside the mapping
  int token_bytes_ = 2;
  uint32_t max_token_ = 0;
};

// Writes `tokens` as a shard at `path`, atomically: the data goes to `path.tmp`, is fsynced,
// then renamed over `path` (and the directory is fsynced), so a reader never sees a half-written
// shard. Requires 1 <= tokens.size() <= kShardMaxTokens. Throws InputError when the file cannot
// be written (the message names the path and the system error). The uint16 overload writes
// magic 20240520 version 1, the uint32 overload magic 20240801 version 7.
void write_shard(const std::string& path, std::span<const uint16_t> tokens);
void write_shard(const std::string& path, std::span<const uint32_t> tokens);

}  // namespace zerod
