// zerod-shards: turns text files into llm.c .bin token shards for `data.train` / `data.val`.
//
//   zerod-shards [--out-dir DIR] [--prefix NAME] [--val-fraction F] [--shard-tokens N]
//                [--tokenizer byte] FILE...
//
// The files are read as bytes and concatenated in the order given; a file that does not end in
// a newline is followed by one, so one file's last line never runs into the next file's first.
// With the byte tokenizer every byte is a token (vocab_size 256). The last --val-fraction of
// the concatenated bytes become DIR/NAME_val_*.bin, the rest DIR/NAME_train_*.bin, at most
// --shard-tokens tokens per shard. Exit codes: 0 success, 2 bad flags or input, 1 internal.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/data/corpus.h"
#include "engine/data/shard.h"

namespace {

// Appends the bytes of `path` to `out`, then a newline if the file does not end in one.
void append_file(const std::string& path, std::vector<uint8_t>& out) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    ZD_THROW_INPUT("input '{}' is a directory, expected a text file", path);
  std::ifstream in(path, std::ios::binary);
  if (!in) ZD_THROW_INPUT("cannot read input file '{}': {}", path, std::strerror(errno));
  const size_t before = out.size();
  out.insert(out.end(), std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  if (in.bad()) ZD_THROW_INPUT("error while reading input file '{}'", path);
  if (out.size() > before && out.back() != '\n') out.push_back('\n');
}

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

int run(int argc, char** argv) {
  CLI::App app{
      "Turn text files into llm.c .bin token shards for zerod's data.train / data.val.\n"
      "The files are concatenated in the order given (a newline is added after a file that\n"
      "does not end in one) and tokenized byte by byte (vocab_size 256)."};
  app.name("zerod-shards");
  std::string out_dir = "data";
  std::string prefix;
  double val_fraction = 0.1;
  int64_t shard_tokens = 100'000'000;
  std::string tokenizer = "byte";
  std::vector<std::string> files;
  app.add_option("--out-dir", out_dir, "Directory for the shards (created)")->capture_default_str();
  app.add_option("--prefix", prefix,
                 "Shard names: PREFIX_train_000000.bin, PREFIX_val_000000.bin, ... "
                 "(default: the first file's name without extension)");
  app.add_option("--val-fraction", val_fraction,
                 "Share of the text, taken from its end, written as validation shards; 0: none")
      ->capture_default_str();
  app.add_option("--shard-tokens", shard_tokens, "Tokens per shard (the last one may be shorter)")
      ->capture_default_str();
  app.add_option("--tokenizer", tokenizer, "Tokenizer; only 'byte' is built in")
      ->capture_default_str();
  app.add_option("FILE", files, "Text files, concatenated in this order")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::fprintf(stderr, "zerod-shards: error: %s\nRun 'zerod-shards --help' for usage.\n",
                 e.what());
    return static_cast<int>(zerod::ErrorKind::kBadInput);
  }

  if (tokenizer != "byte") {
    ZD_THROW_INPUT("--tokenizer '{}': only the byte-level tokenizer ('byte') is built in",
                   tokenizer);
  }
  // The library checks these too; checking here names the flags.
  if (!(val_fraction >= 0.0 && val_fraction < 1.0))
    ZD_THROW_INPUT("--val-fraction {}: expected a number in [0, 1)", val_fraction);
  if (shard_tokens < 1 || shard_tokens > zerod::kShardMaxTokens)
    ZD_THROW_INPUT("--shard-tokens {}: expected 1 .. {}", shard_tokens, zerod::kShardMaxTokens);
  if (prefix.empty()) prefix = prefix_from(files.front());

  std::vector<uint8_t> bytes;
  for (const std::string& f : files) append_file(f, bytes);
  if (bytes.empty()) {
    ZD_THROW_INPUT("the input file(s) are empty: {} file(s), 0 bytes; expected some text",
                   files.size());
  }

  const zerod::CorpusShards result =
      zerod::write_text_shards(bytes, out_dir, val_fraction, shard_tokens, prefix);
  for (const std::string& path : result.removed) fmt::print("removed stale {}\n", path);
  for (const zerod::WrittenShard& s : result.shards)
    fmt::print("wrote {}  ({} tokens, {})\n", s.path, s.num_tokens, s.split);
  int64_t train_files = 0, val_files = 0;
  for (const zerod::WrittenShard& s : result.shards)
    (s.split == "train" ? train_files : val_files)++;
  fmt::print(
      "{} bytes from {} file(s): train {} tokens in {} shard(s), val {} tokens in {} "
      "shard(s); tokenizer byte, vocab_size {}\n",
      bytes.size(), files.size(), result.train_tokens, train_files, result.val_tokens, val_files,
      zerod::kByteVocabSize);
  const std::string dir = std::filesystem::path(out_dir).string();
  if (val_files > 0) {
    fmt::print(
        "job file: \"data\": {{\"train\": \"{0}/{1}_train_*.bin\", \"val\": \"{0}/{1}_val_*.bin\"}}"
        ", \"model\": {{\"vocab_size\": {2}, ...}}\n",
        dir, prefix, zerod::kByteVocabSize);
  } else {
    fmt::print(
        "job file: \"data\": {{\"train\": \"{0}/{1}_train_*.bin\"}}, \"model\": "
        "{{\"vocab_size\": {2}, ...}}\n",
        dir, prefix, zerod::kByteVocabSize);
  }
  return 0;
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
