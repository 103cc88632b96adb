// tokenizer.json's added_tokens: tokens matched in the text before the model sees it, as
// tokenizers' AddedVocabulary does (leftmost-longest, with single_word, lstrip and rstrip). The
// tokens with normalized=false are matched in the raw text, the others in normalized text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace zerod::tokenizer {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
};

// One stretch of a split text: a matched token (id >= 0) or text (id -1), [begin, end).
struct Segment {
  int32_t id;
  size_t begin, end;
};

class AddedTokenMatcher {
 public:
  // patterns[i] is what tokens[i] matches (its content, normalized where it is).
  AddedTokenMatcher(std::vector<AddedToken> tokens, std::vector<std::string> patterns);
  bool empty() const { return tokens_.empty(); }
  // Appends the segments of text (empty text stretches left out).
  void split(std::string_view text, std::vector<Segment>& out) const;

 private:
  std::vector<AddedToken> tokens_;
  std::vector<std::string> patterns_;
  std::unordered_map<unsigned char, std::vector<size_t>> by_first_byte_;  // longest first
};

}  // namespace zerod::tokenizer
