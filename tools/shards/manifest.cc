#include "tools/shards/manifest.h"

#include <nlohmann/json.hpp>
#ifdef ZEROD_HAVE_OPENSSL
#include <openssl/evp.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "core/crc32c.h"
#include "core/error.h"
#include "core/file_write.h"

namespace zerod::shards {

namespace fs = std::filesystem;

namespace {

#ifdef ZEROD_HAVE_OPENSSL
struct EvpCtxDeleter {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
#endif

}  // namespace

std::string manifest_file_name(const std::string& prefix) {
  return prefix + "_manifest.json";
}

std::pair<std::string, std::string> digest_of_files(const std::vector<fs::path>& files) {
#ifdef ZEROD_HAVE_OPENSSL
  std::unique_ptr<EVP_MD_CTX, EvpCtxDeleter> ctx(EVP_MD_CTX_new());
  ZD_CHECK(ctx && EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) == 1,
           "cannot start a SHA-256 digest (OpenSSL)");
#else
  uint32_t crc = 0;
#endif
  std::vector<char> buf(1 << 20);
  for (const fs::path& file : files) {
    std::FILE* f = std::fopen(file.c_str(), "rb");
    if (!f) ZD_THROW_INPUT("cannot read '{}': {}", file.string(), std::strerror(errno));
    size_t got;
    while ((got = std::fread(buf.data(), 1, buf.size(), f)) > 0) {
#ifdef ZEROD_HAVE_OPENSSL
      EVP_DigestUpdate(ctx.get(), buf.data(), got);
#else
      crc = crc32c(buf.data(), got, crc);
#endif
    }
    const bool failed = std::ferror(f) != 0;
    std::fclose(f);
    if (failed) ZD_THROW_INPUT("error while reading '{}'", file.string());
  }
#ifdef ZEROD_HAVE_OPENSSL
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  ZD_CHECK(EVP_DigestFinal_ex(ctx.get(), digest, &len) == 1, "SHA-256 digest failed (OpenSSL)");
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) hex += fmt::format("{:02x}", digest[i]);
  return {"sha256", hex};
#else
  return {"crc32c", fmt::format("{:08x}", crc)};
#endif
}

std::string write_manifest(const CorpusShards& shards, const ManifestInfo& info,
                           const std::string& out_dir, const std::string& prefix) {
  nlohmann::ordered_json m;
  m["format"] = "zerod-shards-manifest";
  m["version"] = 1;
  nlohmann::ordered_json tok;
  tok["path"] = info.tokenizer_path;
  tok["kind"] = info.tokenizer_kind;
  nlohmann::ordered_json names = nlohmann::ordered_json::array();
  for (const fs::path& f : info.tokenizer_files) names.push_back(f.filename().string());
  tok["files"] = names;
  if (!info.tokenizer_files.empty()) {
    const auto [algorithm, hex] = digest_of_files(info.tokenizer_files);
    tok[algorithm] = hex;
  }
  tok["vocab_size"] = info.vocab_size;
  tok["eos_id"] = info.eos_id ? nlohmann::ordered_json(*info.eos_id) : nlohmann::ordered_json();
  m["tokenizer"] = tok;
  m["token_bytes"] = info.token_bytes;
  m["append_eos"] = info.append_eos;
  m["val_fraction"] = info.val_fraction;
  m["shard_tokens"] = info.shard_tokens;
  m["jsonl"] = info.jsonl_text_key ? nlohmann::ordered_json{{"text_key", *info.jsonl_text_key}}
                                   : nlohmann::ordered_json();
  nlohmann::ordered_json inputs = nlohmann::ordered_json::array();
  for (const InputStats& in : info.inputs) {
    inputs.push_back({{"path", in.path},
                      {"kind", in.kind},
                      {"bytes", in.bytes},
                      {"documents", in.documents},
                      {"bad_lines", in.bad_lines}});
  }
  m["inputs"] = inputs;
  m["documents"] = info.documents;
  m["bad_lines"] = info.bad_lines;
  m["train_tokens"] = shards.train_tokens;
  m["val_tokens"] = shards.val_tokens;
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  int64_t begin = 0;  // the shard's first token in the whole stream (train shards, then val)
  for (const WrittenShard& s : shards.shards) {
    const int64_t end = begin + s.num_tokens;
    const auto& starts = info.document_starts;
    const int64_t docs = std::lower_bound(starts.begin(), starts.end(), end) -
                         std::lower_bound(starts.begin(), starts.end(), begin);
    const auto [algorithm, hex] = digest_of_files({fs::path(s.path)});
    list.push_back({{"file", fs::path(s.path).filename().string()},
                    {"split", s.split},
                    {"tokens", s.num_tokens},
                    {"documents", docs},
                    {algorithm, hex}});
    begin = end;
  }
  m["shards"] = list;
  const std::string path = (fs::path(out_dir) / manifest_file_name(prefix)).string();
  write_file_atomically(path, m.dump(2) + "\n");
  return path;
}

}  // namespace zerod::shards
