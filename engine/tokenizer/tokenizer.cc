#include "engine/tokenizer/tokenizer.h"

#include "core/error.h"
#include "engine/tokenizer/hf_bpe.h"

namespace zerod::tokenizer {

std::unique_ptr<Tokenizer> load_sentencepiece(const std::filesystem::path& file);

std::vector<int32_t> Tokenizer::encode_with_specials(std::string_view text) const {
  std::vector<int32_t> ids;
  if (policy_.add_bos && bos_) ids.push_back(*bos_);
  std::vector<int32_t> body = encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  if (policy_.add_eos && eos_) ids.push_back(*eos_);
  return ids;
}

std::optional<int32_t> Tokenizer::special_id(std::string_view content) const {
  for (const SpecialToken& t : specials_) {
    if (t.content == content) return t.id;
  }
  return std::nullopt;
}

bool Tokenizer::is_special(int32_t id) const {
  for (const SpecialToken& t : specials_) {
    if (t.id == id) return true;
  }
  return false;
}

void Tokenizer::set_policy(SpecialPolicy policy) {
  ZD_CHECK_INPUT(!policy.add_bos || bos_, "{}: has no BOS token to add", describe());
  ZD_CHECK_INPUT(!policy.add_eos || eos_, "{}: has no EOS token to add", describe());
  policy_ = policy;
}

bool have_regex_support() {
#ifdef ZEROD_HAVE_PCRE2
  return true;
#else
  return false;
#endif
}

namespace {

namespace fs = std::filesystem;

constexpr std::string_view kSupported =
    "supported: a Hugging Face tokenizer.json with a BPE model (or a directory holding one), "
    "GPT-2's vocab.json + merges.txt (their directory, or vocab.json), a SentencePiece .model "
    "file (or a directory holding tokenizer.model)";

bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

// The first bytes of a file, to tell JSON from a protobuf.
std::string head(const fs::path& p, size_t n) {
  std::FILE* f = std::fopen(p.c_str(), "rb");
  if (!f) return {};
  std::string s(n, '\0');
  s.resize(std::fread(s.data(), 1, n, f));
  std::fclose(f);
  return s;
}

}  // namespace

TokenizerFiles find_tokenizer(const fs::path& path) {
  std::error_code ec;
  const auto status = fs::status(path, ec);
  ZD_CHECK_INPUT(fs::exists(status), "tokenizer {}: no such file or directory ({})", path.string(),
                 kSupported);
  if (fs::is_directory(status)) {
    if (is_file(path / "tokenizer.json"))
      return {TokenizerKind::kHfJson, {path / "tokenizer.json"}};
    if (is_file(path / "vocab.json") && is_file(path / "merges.txt"))
      return {TokenizerKind::kGpt2Files, {path / "vocab.json", path / "merges.txt"}};
    if (is_file(path / "tokenizer.model"))
      return {TokenizerKind::kSentencePiece, {path / "tokenizer.model"}};
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(path, ec)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    std::string found;
    for (size_t i = 0; i < names.size() && i < 12; ++i) found += (i ? ", " : "") + names[i];
    if (names.size() > 12) found += fmt::format(" and {} more", names.size() - 12);
    if (is_file(path / "vocab.json")) {
      ZD_THROW_INPUT("tokenizer directory {}: has vocab.json but no merges.txt ({})", path.string(),
                     kSupported);
    }
    ZD_THROW_INPUT("tokenizer directory {}: no tokenizer.json, vocab.json + merges.txt or "
                   "tokenizer.model in it (found: {}; {})",
                   path.string(), found.empty() ? "nothing" : found, kSupported);
  }
  ZD_CHECK_INPUT(fs::is_regular_file(status), "tokenizer {}: not a file or a directory ({})",
                 path.string(), kSupported);
  const std::string ext = path.extension().string();
  const std::string name = path.filename().string();
  if (name == "merges.txt") {
    const fs::path vocab = path.parent_path() / "vocab.json";
    ZD_CHECK_INPUT(is_file(vocab), "{}: GPT-2's merges.txt needs vocab.json beside it ({})",
                   path.string(), kSupported);
    return {TokenizerKind::kGpt2Files, {vocab, path}};
  }
  if (ext == ".model") return {TokenizerKind::kSentencePiece, {path}};
  const std::string first = head(path, 64);
  const size_t nonspace = first.find_first_not_of(" \t\r\n");
  if (ext == ".json" || (nonspace != std::string::npos && first[nonspace] == '{')) {
    if (name == "vocab.json") {
      const fs::path merges = path.parent_path() / "merges.txt";
      ZD_CHECK_INPUT(is_file(merges),
                     "{}: a GPT-2 vocab.json needs merges.txt beside it, and {} is not there ({})",
                     path.string(), merges.string(), kSupported);
      return {TokenizerKind::kGpt2Files, {path, merges}};
    }
    return {TokenizerKind::kHfJson, {path}};
  }
  std::string what = "a file of unknown kind";
  if (ext == ".tiktoken") what = "a tiktoken BPE file";
  else if (first.empty()) what = "an empty file";
  else if (ext == ".txt") what = "a text file";
  ZD_THROW_INPUT("tokenizer {}: {}, not a tokenizer zerod can load ({})", path.string(), what,
                 kSupported);
}

std::unique_ptr<Tokenizer> load_tokenizer(const fs::path& path) {
  const TokenizerFiles found = find_tokenizer(path);
  switch (found.kind) {
    case TokenizerKind::kHfJson:
      return load_hf_tokenizer_json(found.files[0]);
    case TokenizerKind::kGpt2Files:
      return load_gpt2_files(found.files[0], found.files[1]);
    case TokenizerKind::kSentencePiece:
      return load_sentencepiece(found.files[0]);
  }
  ZD_THROW("tokenizer {}: unknown kind", path.string());
}

std::vector<fs::path> tokenizer_companion_files(const TokenizerFiles& found) {
  std::vector<fs::path> out;
  if (found.files.empty()) return out;
  const fs::path dir = found.files.front().parent_path();
  for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"}) {
    if (is_file(dir / name)) out.push_back(dir / name);
  }
  return out;
}

std::unique_ptr<Tokenizer> load_tokenizer_in(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return nullptr;
  const bool holds = is_file(dir / "tokenizer.json") ||
                     (is_file(dir / "vocab.json") && is_file(dir / "merges.txt")) ||
                     (have_sentencepiece_support() && is_file(dir / "tokenizer.model"));
  return holds ? load_tokenizer(dir) : nullptr;
}

}  // namespace zerod::tokenizer
