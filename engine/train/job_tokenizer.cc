#include "engine/train/job_tokenizer.h"

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>

#include "core/crc32c.h"
#include "core/error.h"
#include "core/file_write.h"
#include "engine/checkpoint/checkpoint_dir.h"

namespace zerod {

namespace fs = std::filesystem;

namespace {

std::string read_bytes(const fs::path& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) ZD_THROW_INPUT("cannot read {}: {}", path.string(), std::strerror(errno));
  std::string out;
  char buf[1 << 16];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, got);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) ZD_THROW_INPUT("error while reading {}", path.string());
  return out;
}

// tokenizer_config.json for transformers: which class reads the files, and the special tokens.
std::string tokenizer_config(const tokenizer::Tokenizer& tok, tokenizer::TokenizerKind kind,
                             int64_t max_length) {
  nlohmann::ordered_json j;
  j["tokenizer_class"] = kind == tokenizer::TokenizerKind::kGpt2Files ? "GPT2Tokenizer"
                         : kind == tokenizer::TokenizerKind::kSentencePiece
                             ? "LlamaTokenizer"
                             : "PreTrainedTokenizerFast";
  if (tok.bos_id()) j["bos_token"] = tok.id_to_token(*tok.bos_id()).value_or("");
  if (tok.eos_id()) j["eos_token"] = tok.id_to_token(*tok.eos_id()).value_or("");
  j["model_max_length"] = max_length;
  j["clean_up_tokenization_spaces"] = false;
  return j.dump(2) + "\n";
}

}  // namespace

std::optional<JobTokenizer> load_job_tokenizer(const JobConfig& cfg) {
  if (cfg.data.tokenizer.empty()) return std::nullopt;
  JobTokenizer out;
  out.source = cfg.data.tokenizer;
  tokenizer::TokenizerFiles found;
  try {
    found = tokenizer::find_tokenizer(cfg.data.tokenizer);
    out.tokenizer = tokenizer::load_tokenizer(cfg.data.tokenizer);
  } catch (const InputError& e) {
    ZD_THROW_INPUT("data.tokenizer: {}", e.what());
  }
  const int64_t ids = out.tokenizer->vocab_size();
  if (ids > cfg.model.vocab_size) {
    ZD_THROW_INPUT(
        "data.tokenizer '{}' ({}) has {} token ids, more than model.vocab_size {}: "
        "ids >= {} have no embedding row; expected a model.vocab_size of at least {}",
        cfg.data.tokenizer, out.tokenizer->describe(), ids, cfg.model.vocab_size,
        cfg.model.vocab_size, ids);
  }
  out.files = found.files;
  const std::vector<fs::path> companions = tokenizer::tokenizer_companion_files(found);
  out.files.insert(out.files.end(), companions.begin(), companions.end());
  bool has_config = false;
  for (const fs::path& f : companions)
    has_config = has_config || f.filename() == "tokenizer_config.json";
  if (!has_config)
    out.generated_config = tokenizer_config(*out.tokenizer, found.kind, cfg.model.seq_len);
  return out;
}

CheckpointTokenizer write_job_tokenizer(const JobTokenizer& tok, const fs::path& dir,
                                        const std::string& prefix) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) ZD_THROW_INPUT("cannot create {}: {}", dir.string(), ec.message());
  CheckpointTokenizer out;
  out.source = tok.source;
  out.kind = tok.tokenizer->describe();
  auto put = [&](const std::string& name, const std::string& bytes) {
    write_file_synced((dir / name).string(), bytes);
    out.files.push_back(SideFile{prefix + name, static_cast<int64_t>(bytes.size()),
                                 crc32c(bytes.data(), bytes.size())});
  };
  for (const fs::path& f : tok.files) put(f.filename().string(), read_bytes(f));
  if (!tok.generated_config.empty()) put("tokenizer_config.json", tok.generated_config);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return out;
}

std::unique_ptr<tokenizer::Tokenizer> load_checkpoint_tokenizer(const std::string& checkpoint_dir,
                                                                const std::string& which) {
  // Sizes only: the weights' checksums are checked by whoever loads them.
  FindOptions options;
  options.checksums = false;
  FoundCheckpoint found;
  try {
    found = find_checkpoint(checkpoint_dir, which, options);
  } catch (const InputError&) {
    return nullptr;  // no such checkpoint: whoever loads the weights says so
  }
  if (!found.manifest.tokenizer) return nullptr;
  // The tokenizer's own files are checked in full: a damaged one must not encode silently.
  Manifest only_tokenizer;
  only_tokenizer.tokenizer = found.manifest.tokenizer;
  verify_checkpoint(found.path, only_tokenizer);
  return tokenizer::load_tokenizer(fs::path(found.path) / "tokenizer");
}

std::unique_ptr<tokenizer::Tokenizer> load_source_tokenizer(const std::string& from,
                                                            const std::string& which) {
  std::error_code ec;
  if (from.empty() || !fs::is_directory(from, ec)) return nullptr;
  if (auto tok = tokenizer::load_tokenizer_in(from)) return tok;
  if (fs::exists(fs::path(from) / "config.json", ec)) return nullptr;  // Hugging Face, none
  return load_checkpoint_tokenizer(from, which);
}

}  // namespace zerod
