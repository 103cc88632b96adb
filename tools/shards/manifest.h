// PREFIX_manifest.json: what zerod-shards made and from what, written beside the shards.
//
//   {"format": "zerod-shards-manifest", "version": 1,
//    "tokenizer": {"path": "tok/tokenizer.json", "kind": "tokenizer.json (BPE, byte-level)",
//                  "files": ["tokenizer.json"], "sha256": "...", "vocab_size": 50257,
//                  "eos_id": 50256},
//    "token_bytes": 2, "append_eos": true, "val_fraction": 0.01, "shard_tokens": 100000000,
//    "jsonl": {"text_key": "text"} | null,
//    "inputs": [{"path": "a.jsonl.zst", "kind": "zstd", "bytes": 123, "documents": 4,
//                "bad_lines": 0}],
//    "documents": 4, "bad_lines": 0, "train_tokens": 900, "val_tokens": 100,
//    "shards": [{"file": "web_train_000000.bin", "split": "train", "tokens": 900,
//                "documents": 3, "sha256": "..."}, ...]}
//
// (Built without OpenSSL, "crc32c" stands where "sha256" does.) The tokenizer's sha256 is that of
// its files' bytes in the order listed (for one tokenizer.json, what `sha256sum tokenizer.json`
// prints). A shard's "documents" counts the documents that begin in it. Nothing in it depends on
// the time or the thread count, so the same input and flags give the same manifest byte for byte.
// Written to a temporary name and renamed, after the shards.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/data/corpus.h"
#include "tools/shards/documents.h"

namespace zerod::shards {

struct ManifestInfo {
  std::string tokenizer_path;                          // as given on the command line, or "byte"
  std::string tokenizer_kind;                          // Tokenizer::describe(), or "byte"
  std::vector<std::filesystem::path> tokenizer_files;  // hashed; none for "byte"
  int64_t vocab_size = 0;
  std::optional<int32_t> eos_id;
  int token_bytes = 2;
  bool append_eos = false;
  double val_fraction = 0;
  int64_t shard_tokens = 0;
  std::optional<std::string> jsonl_text_key;
  std::vector<InputStats> inputs;
  int64_t documents = 0;
  int64_t bad_lines = 0;
  std::vector<int64_t> document_starts;  // token offset where each document begins, ascending
};

// The file name, "PREFIX_manifest.json".
std::string manifest_file_name(const std::string& prefix);

// The digest of the files' bytes, in order, as {algorithm, lowercase hex}: {"sha256", ...}, or
// {"crc32c", ...} in a build without OpenSSL (InputError naming an unreadable file).
std::pair<std::string, std::string> digest_of_files(
    const std::vector<std::filesystem::path>& files);

// Writes out_dir/PREFIX_manifest.json for `shards`; returns its path.
std::string write_manifest(const CorpusShards& shards, const ManifestInfo& info,
                           const std::string& out_dir, const std::string& prefix);

}  // namespace zerod::shards
