// The pieces of a tokenizer.json pipeline around its model, as Hugging Face tokenizers runs
// them: normalizers (Sequence, Replace, Prepend), pre-tokenizers (Sequence, Split, ByteLevel,
// Metaspace) and decoders (Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace).
// Anything else is refused at load with the list of what is supported.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/tokenizer/hf_json.h"

namespace zerod::tokenizer {

// A stretch of text on its way to the model. at_start: it begins at the start of the input
// (Metaspace's prepend_scheme "first").
struct Piece {
  std::string text;
  bool at_start = false;
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& s) const = 0;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces pieces by their splits (empty pieces dropped).
  virtual void pre_tokenize(std::vector<Piece>& pieces) const = 0;
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  // tokenizers' Decoder::decode_chain: tokens in, strings out (joined by the caller).
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

// nullptr for a JSON null.
std::unique_ptr<Normalizer> make_normalizer(const JsonAt& j);
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const JsonAt& j);
std::unique_ptr<Decoder> make_decoder(const JsonAt& j);

// Rust's String::from_utf8_lossy: each maximal invalid subsequence becomes U+FFFD.
std::string utf8_lossy(std::string_view bytes);

}  // namespace zerod::tokenizer
