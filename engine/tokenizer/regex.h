// The regular expressions of tokenizer.json pre-tokenizers (Split, ByteLevel's GPT-2 pattern)
// through PCRE2 with UTF and Unicode properties, matching as Hugging Face tokenizers' Oniguruma
// does: \s and \S are rewritten to Unicode White_Space, Oniguruma's \s (PCRE2's differs), invalid
// UTF-8 never matches. Without PCRE2 in the build, constructing one is an InputError.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace zerod::tokenizer {

class Regex {
 public:
  // what names the pattern's origin for messages ("tokenizer.json /pre_tokenizer/pattern").
  Regex(std::string_view pattern, std::string_view what);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends the [begin, end) byte offsets of every non-overlapping match of text, left to
  // right (empty matches are skipped).
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

  // The pattern as given to PCRE2 (after the \s rewrite).
  const std::string& compiled_pattern() const { return pattern_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string pattern_;
};

// Oniguruma's \s/\S as explicit classes of Unicode White_Space (exposed for the tests).
std::string translate_pattern(std::string_view pattern);

// GPT-2's pre-tokenizer pattern (HF ByteLevel's use_regex).
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace zerod::tokenizer
