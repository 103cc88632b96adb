// A Hugging Face tokenizer.json with a BPE model, run as tokenizers runs it: added tokens out of
// the raw text, the normalizer, added tokens out of the normalized text, the pre-tokenizer, the
// BPE model on each piece; decode through the decoder. Byte-level files (GPT-2, Llama 3, Qwen2
// without NFC) and SentencePiece-style files with byte_fallback (Llama 2, Mistral). GPT-2's
// vocab.json + merges.txt load into the same class (gpt2_files.cc).
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/tokenizer/added_tokens.h"
#include "engine/tokenizer/bpe_model.h"
#include "engine/tokenizer/hf_components.h"
#include "engine/tokenizer/tokenizer.h"

namespace zerod::tokenizer {

struct HfBpeParts {
  std::unique_ptr<BpeModel> model;
  std::vector<AddedToken> added;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<Decoder> decoder;
  std::vector<int32_t> prefix, suffix;  // the post-processor's single-sequence template
  std::string bos_token, eos_token;     // tokenizer_config.json's, empty when unknown
  std::string description;
};

class HfBpeTokenizer : public Tokenizer {
 public:
  explicit HfBpeTokenizer(HfBpeParts parts);

  std::vector<int32_t> encode(std::string_view text) const override;
  // Byte-level: the bytes exactly, where tokenizers would replace invalid UTF-8 by U+FFFD
  // (utf8_lossy gives its string), so decode(encode(x)) == x for any bytes x.
  std::string decode(std::span<const int32_t> ids) const override;
  int32_t vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> token_to_id(std::string_view token) const override;
  std::optional<std::string> id_to_token(int32_t id) const override;
  std::string describe() const override { return parts_.description; }

 private:
  void encode_normalized(std::string_view text, bool at_start, std::vector<int32_t>& out) const;

  HfBpeParts parts_;
  std::unique_ptr<AddedTokenMatcher> raw_matcher_, normalized_matcher_;
  std::unordered_map<int32_t, std::string> added_by_id_;
  std::unordered_map<std::string, int32_t> added_by_content_;
  int32_t vocab_size_ = 0;
};

// tokenizer.json (tokenizer_config.json beside it, when there, names BOS and EOS).
std::unique_ptr<Tokenizer> load_hf_tokenizer_json(const std::filesystem::path& file);
// GPT-2's vocab.json + merges.txt: byte-level BPE with GPT-2's pattern; <|endoftext|>, when in
// the vocabulary, is a special token and BOS and EOS.
std::unique_ptr<Tokenizer> load_gpt2_files(const std::filesystem::path& vocab_json,
                                           const std::filesystem::path& merges_txt);

}  // namespace zerod::tokenizer
