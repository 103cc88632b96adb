// zerod-shards: turns text files into llm.c .bin token shards for `data.train` / `data.val`.
//
//   zerod-shards [--out-dir DIR] [--prefix NAME] [--val-fraction F] [--shard-tokens N]
//                [--tokenizer byte|PATH] [--jsonl [--text-key KEY] [--skip-bad-lines]]
//                [--append-eos] [--threads N] FILE...
//
// --tokenizer byte (the default): the files are read as bytes and concatenated in the order
// given; a file that does not end in a newline is followed by one, so one file's last line
// never runs into the next file's first. Every byte is a token (vocab_size 256). With --jsonl
// the records' texts are the files' contents, each followed by a newline.
//
// --tokenizer PATH (a tokenizer.json or its directory, GPT-2's vocab.json + merges.txt, a
// SentencePiece .model: engine/tokenizer's load_tokenizer): every document (a whole text file,
// or with --jsonl each record's --text-key string) is encoded on its own, on all cores, and the
// ids are concatenated in input order, each document followed by the tokenizer's EOS id with
// --append-eos. Shards hold uint16 tokens when the vocabulary fits (vocab_size <= 65536), uint32
// (llm.c's magic 20240801) otherwise.
//
// The last --val-fraction of the tokens become DIR/NAME_val_*.bin, the rest
// DIR/NAME_train_*.bin, at most --shard-tokens tokens per shard, each written to a temporary
// name and renamed, then DIR/NAME_manifest.json (manifest.h: tokenizer and its hash, inputs,
// documents, each shard's tokens, documents and hash). Inputs may be gzip (.gz) or zstd (.zst)
// compressed. The output depends only on the inputs and flags. Exit codes: 0 success,
// 2 bad flags or input (a bad JSONL line names the file and line), 1 internal.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/data/corpus.h"
#include "engine/data/shard.h"
#include "engine/tokenizer/tokenizer.h"
#include "tools/shards/documents.h"
#include "tools/shards/encode.h"
#include "tools/shards/manifest.h"

namespace {

// A default prefix from a file name: its stem with characters outside [A-Za-z0-9._-] as '_'.
std::string prefix_from(const std::string& path) {
  std::string stem = std::filesystem::path(path).stem().string();
  for (char& c : stem) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) c = '_';
  }
  return stem.empty() ? std::string("corpus") : stem;
}

// Documents are read and encoded in batches of about this many bytes of text.
constexpr size_t kBatchBytes = 64u << 20;

struct Options {
  std::string out_dir = "data";
  std::string prefix;
  double val_fraction = 0.1;
  int64_t shard_tokens = 100'000'000;
  std::string tokenizer = "byte";
  zerod::shards::DocumentOptions docs;
  bool append_eos = false;
  int threads = 0;
  std::vector<std::string> files;
};

// The manifest fields common to both tokenizers.
zerod::shards::ManifestInfo manifest_info(const Options& o,
                                          const zerod::shards::DocumentReader& reader) {
  zerod::shards::ManifestInfo info;
  info.append_eos = o.append_eos;
  info.val_fraction = o.val_fraction;
  info.shard_tokens = o.shard_tokens;
  if (o.docs.jsonl) info.jsonl_text_key = o.docs.text_key;
  info.inputs = reader.inputs();
  info.documents = reader.documents();
  info.bad_lines = reader.bad_lines();
  return info;
}

void print_summary(const zerod::CorpusShards& result, const Options& o, const std::string& what,
                   const std::string& tokenizer, int64_t vocab_size, int token_bytes,
                   const std::string& manifest) {
  for (const std::string& path : result.removed) fmt::print("removed stale {}\n", path);
  for (const zerod::WrittenShard& s : result.shards)
    fmt::print("wrote {}  ({} tokens, {})\n", s.path, s.num_tokens, s.split);
  int64_t train_files = 0, val_files = 0;
  for (const zerod::WrittenShard& s : result.shards)
    (s.split == "train" ? train_files : val_files)++;
  fmt::print(
      "{} from {} file(s): train {} tokens in {} shard(s), val {} tokens in {} "
      "shard(s); tokenizer {}, vocab_size {}{}\n",
      what, o.files.size(), result.train_tokens, train_files, result.val_tokens, val_files,
      tokenizer, vocab_size, token_bytes == 4 ? ", uint32 tokens" : "");
  fmt::print("manifest {}\n", manifest);
  const std::string dir = std::filesystem::path(o.out_dir).string();
  if (val_files > 0) {
    fmt::print(
        "job file: \"data\": {{\"train\": \"{0}/{1}_train_*.bin\", \"val\": \"{0}/{1}_val_*.bin\"}}"
        ", \"model\": {{\"vocab_size\": {2}, ...}}\n",
        dir, o.prefix, vocab_size);
  } else {
    fmt::print(
        "job file: \"data\": {{\"train\": \"{0}/{1}_train_*.bin\"}}, \"model\": "
        "{{\"vocab_size\": {2}, ...}}\n",
        dir, o.prefix, vocab_size);
  }
}

// --tokenizer byte.
int run_bytes(const Options& o) {
  if (o.append_eos) {
    ZD_THROW_INPUT(
        "--append-eos: the byte tokenizer has no EOS token (its 256 ids are the byte values); "
        "pass --tokenizer PATH");
  }
  std::vector<uint8_t> bytes;
  std::vector<int64_t> starts;
  zerod::shards::DocumentReader reader(o.files, o.docs);
  while (std::optional<std::string> doc = reader.next()) {
    if (doc->empty() && !o.docs.jsonl) continue;
    starts.push_back(static_cast<int64_t>(bytes.size()));
    bytes.insert(bytes.end(), doc->begin(), doc->end());
    if (o.docs.jsonl || doc->back() != '\n') bytes.push_back('\n');
  }
  if (bytes.empty()) {
    ZD_THROW_INPUT("the input file(s) are empty: {} file(s), 0 bytes; expected some text",
                   o.files.size());
  }
  const zerod::CorpusShards result =
      zerod::write_text_shards(bytes, o.out_dir, o.val_fraction, o.shard_tokens, o.prefix);
  zerod::shards::ManifestInfo info = manifest_info(o, reader);
  info.tokenizer_path = "byte";
  info.tokenizer_kind = "byte";
  info.vocab_size = zerod::kByteVocabSize;
  info.document_starts = std::move(starts);
  const std::string manifest = zerod::shards::write_manifest(result, info, o.out_dir, o.prefix);
  print_summary(result, o, fmt::format("{} bytes", bytes.size()), "byte", zerod::kByteVocabSize, 2,
                manifest);
  return 0;
}

// --tokenizer PATH.
int run_tokenizer(const Options& o) {
  std::unique_ptr<zerod::tokenizer::Tokenizer> tok;
  try {
    tok = zerod::tokenizer::load_tokenizer(o.tokenizer);
  } catch (const zerod::InputError& e) {
    ZD_THROW_INPUT("--tokenizer '{}': {}; or 'byte' for the built-in byte-level tokenizer",
                   o.tokenizer, e.what());
  }
  int32_t eos = -1;
  if (o.append_eos) {
    if (!tok->eos_id()) {
      ZD_THROW_INPUT("--append-eos: tokenizer '{}' ({}) has no EOS token", o.tokenizer,
                     tok->describe());
    }
    eos = *tok->eos_id();
  }
  zerod::shards::DocumentReader reader(o.files, o.docs);
  std::vector<uint32_t> tokens;
  std::vector<int64_t> starts;
  std::vector<std::string> batch;
  size_t batch_bytes = 0;
  auto flush = [&] {
    zerod::shards::encode_documents(*tok, batch, eos, o.threads, tokens, &starts);
    batch.clear();
    batch_bytes = 0;
  };
  while (std::optional<std::string> doc = reader.next()) {
    batch_bytes += doc->size();
    batch.push_back(std::move(*doc));
    if (batch_bytes >= kBatchBytes) flush();
  }
  flush();
  if (tokens.empty()) {
    ZD_THROW_INPUT("the input gave no tokens: {} file(s), {} document(s){}", o.files.size(),
                   reader.documents(),
                   reader.bad_lines() > 0
                       ? fmt::format(", {} bad line(s) skipped", reader.bad_lines())
                       : std::string());
  }
  const int64_t vocab_size = tok->vocab_size();
  const zerod::CorpusShards result = zerod::write_token_shards(
      tokens, vocab_size, o.out_dir, o.val_fraction, o.shard_tokens, o.prefix);
  const int token_bytes = vocab_size <= zerod::kShardU16MaxVocab ? 2 : 4;
  zerod::shards::ManifestInfo info = manifest_info(o, reader);
  info.tokenizer_path = o.tokenizer;
  info.tokenizer_kind = tok->describe();
  info.tokenizer_files = zerod::tokenizer::find_tokenizer(o.tokenizer).files;
  info.vocab_size = vocab_size;
  info.eos_id = tok->eos_id();
  info.token_bytes = token_bytes;
  info.document_starts = std::move(starts);
  const std::string manifest = zerod::shards::write_manifest(result, info, o.out_dir, o.prefix);
  std::string what = fmt::format("{} document(s)", reader.documents());
  if (reader.bad_lines() > 0) what += fmt::format(" ({} bad line(s) skipped)", reader.bad_lines());
  print_summary(result, o, what, tok->describe(), vocab_size, token_bytes, manifest);
  return 0;
}

int run(int argc, char** argv) {
  CLI::App app{
      "Turn text or JSONL files into llm.c .bin token shards for zerod's data.train / "
      "data.val.\n"
      "--tokenizer byte (default): the files are concatenated in the order given (a newline is\n"
      "added after a file that does not end in one) and tokenized byte by byte (vocab_size 256).\n"
      "--tokenizer PATH: each document (a text file, or a JSONL record with --jsonl) is encoded\n"
      "with the tokenizer at PATH; uint16 shards when vocab_size <= 65536, else uint32."};
  app.name("zerod-shards");
  Options o;
  std::string& out_dir = o.out_dir;
  std::string& prefix = o.prefix;
  double& val_fraction = o.val_fraction;
  int64_t& shard_tokens = o.shard_tokens;
  std::string& tokenizer = o.tokenizer;
  std::vector<std::string>& files = o.files;
  app.add_option("--out-dir", out_dir, "Directory for the shards (created)")->capture_default_str();
  app.add_option("--prefix", prefix,
                 "Shard names: PREFIX_train_000000.bin, PREFIX_val_000000.bin, ... "
                 "(default: the first file's name without extension)");
  app.add_option("--val-fraction", val_fraction,
                 "Share of the text, taken from its end, written as validation shards; 0: none")
      ->capture_default_str();
  app.add_option("--shard-tokens", shard_tokens, "Tokens per shard (the last one may be shorter)")
      ->capture_default_str();
  app.add_option("--tokenizer", tokenizer,
                 "'byte', or a tokenizer: tokenizer.json (or its directory), GPT-2 vocab.json "
                 "(+ merges.txt beside it), SentencePiece .model")
      ->capture_default_str();
  CLI::Option* jsonl = app.add_flag(
      "--jsonl", o.docs.jsonl,
      "The files are JSONL: one JSON object per line, its --text-key string a document");
  app.add_option("--text-key", o.docs.text_key, "The member of each JSONL record holding its text")
      ->capture_default_str()
      ->needs(jsonl);
  app.add_flag("--skip-bad-lines", o.docs.skip_bad_lines,
               "Skip JSONL lines that are not an object with a --text-key string (each reported "
               "on stderr) instead of stopping with exit code 2")
      ->needs(jsonl);
  app.add_flag("--append-eos", o.append_eos,
               "Put the tokenizer's EOS id after each document (text file or JSONL record)");
  app.add_option("--threads", o.threads, "Encoding threads; 0: all cores")
      ->capture_default_str()
      ->check(CLI::Range(0, 4096));
  app.add_option("FILE", files, "Text or JSONL files, read in this order")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::fprintf(stderr, "zerod-shards: error: %s\nRun 'zerod-shards --help' for usage.\n",
                 e.what());
    return static_cast<int>(zerod::ErrorKind::kBadInput);
  }

  // The library checks these too; checking here names the flags.
  if (!(val_fraction >= 0.0 && val_fraction < 1.0))
    ZD_THROW_INPUT("--val-fraction {}: expected a number in [0, 1)", val_fraction);
  if (shard_tokens < 1 || shard_tokens > zerod::kShardMaxTokens)
    ZD_THROW_INPUT("--shard-tokens {}: expected 1 .. {}", shard_tokens, zerod::kShardMaxTokens);
  if (prefix.empty()) prefix = prefix_from(files.front());
  if (tokenizer.empty()) ZD_THROW_INPUT("--tokenizer: expected 'byte' or a path, found ''");
  return tokenizer == "byte" ? run_bytes(o) : run_tokenizer(o);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const zerod::Error& e) {
    std::fprintf(stderr, "zerod-shards: error: %s\n", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zerod-shards: internal error: %s\n", e.what());
    return 1;
  }
}
