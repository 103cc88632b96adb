// Tokenizers: text to token ids and back, natively, equal to the Python references (Hugging
// Face tokenizers for tokenizer.json and GPT-2 vocab.json + merges.txt, sentencepiece for
// .model files; tests/tokenizer holds the C++ side against them).
//
//   auto tok = zerod::tokenizer::load_tokenizer("path/to/tokenizer.json");
//   std::vector<int32_t> ids = tok->encode("Hello world");           // no BOS/EOS
//   std::vector<int32_t> with = tok->encode_with_specials("Hello");  // BOS/EOS by policy()
//   std::string text = tok->decode(ids);
//
// Tokenizers are immutable after loading except for set_policy(); encode and decode may be
// called from many threads at once.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace zerod::tokenizer {

// A token that is not text: <s>, </s>, <|endoftext|>, <unk>, <|begin_of_text|> ...
struct SpecialToken {
  std::string content;
  int32_t id = 0;
};

// Which special tokens encode_with_specials adds around a text.
struct SpecialPolicy {
  bool add_bos = false;
  bool add_eos = false;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // The ids of text with no BOS/EOS added (HF encode(add_special_tokens=False), sentencepiece
  // Encode). Special tokens written in the text are matched where the format does (HF
  // added_tokens); sentencepiece treats all text as text.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // encode() with bos_id() before and eos_id() after as policy() says.
  std::vector<int32_t> encode_with_specials(std::string_view text) const;
  // The text of ids (special tokens included, as HF decode(skip_special_tokens=False)). Ids
  // outside the vocabulary are skipped.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;

  // One past the largest id (the model's vocabulary and added tokens).
  virtual int32_t vocab_size() const = 0;
  virtual std::optional<int32_t> token_to_id(std::string_view token) const = 0;
  virtual std::optional<std::string> id_to_token(int32_t id) const = 0;
  // What was loaded, for messages: "tokenizer.json (BPE, byte-level)", "sentencepiece unigram".
  virtual std::string describe() const = 0;

  const std::vector<SpecialToken>& special_tokens() const { return specials_; }
  std::optional<int32_t> special_id(std::string_view content) const;
  bool is_special(int32_t id) const;
  std::optional<int32_t> bos_id() const { return bos_; }
  std::optional<int32_t> eos_id() const { return eos_; }
  SpecialPolicy policy() const { return policy_; }
  // Throws InputError when the policy asks for a BOS/EOS the tokenizer does not have.
  void set_policy(SpecialPolicy policy);

 protected:
  std::vector<SpecialToken> specials_;
  std::optional<int32_t> bos_, eos_;
  SpecialPolicy policy_;
};

enum class TokenizerKind { kHfJson, kGpt2Files, kSentencePiece };

// The files a tokenizer is read from.
struct TokenizerFiles {
  TokenizerKind kind = TokenizerKind::kHfJson;
  // kHfJson: {tokenizer.json}; kGpt2Files: {vocab.json, merges.txt}; kSentencePiece: {.model}.
  std::vector<std::filesystem::path> files;
};

// Which files load_tokenizer(path) reads and as what kind (the rules below), without reading
// them; an InputError as load_tokenizer's when path holds no tokenizer.
TokenizerFiles find_tokenizer(const std::filesystem::path& path);

// The files beside found.files that Hugging Face's AutoTokenizer reads with them
// (tokenizer_config.json, special_tokens_map.json), those that exist.
std::vector<std::filesystem::path> tokenizer_companion_files(const TokenizerFiles& found);

// Loads the tokenizer at path, detecting its kind:
//   - a Hugging Face tokenizer.json (or a directory holding one) with a BPE model;
//   - GPT-2's vocab.json + merges.txt (the directory holding them, or vocab.json);
//   - a SentencePiece model (a .model file, or a directory holding tokenizer.model).
// Anything else is an InputError naming what was found and listing what is supported.
std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& path);

// The tokenizer a model directory holds, loaded as load_tokenizer loads a directory, or nullptr
// when it is no directory or holds none this build can load (a tokenizer.model counts only with
// libsentencepiece).
std::unique_ptr<Tokenizer> load_tokenizer_in(const std::filesystem::path& dir);

// Whether this build can load each kind (the optional libraries: PCRE2 for tokenizer.json
// regex pre-tokenizers and GPT-2 files, libsentencepiece for .model files).
bool have_regex_support();
bool have_sentencepiece_support();

}  // namespace zerod::tokenizer
