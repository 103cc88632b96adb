#include "engine/tokenizer/added_tokens.h"

#include <algorithm>

#include "engine/tokenizer/utf8.h"

namespace zerod::tokenizer {
namespace {

// The code point of the last character of s (a lone invalid byte counts as one).
uint32_t last_char(std::string_view s) {
  size_t i = s.size() - 1;
  for (size_t k = 0; k < 3 && i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80; ++k) --i;
  const size_t n = utf8_char_len(s, i);
  if (i + n != s.size()) i = s.size() - 1;
  return utf8_decode(s, i, utf8_char_len(s, i));
}

uint32_t first_char(std::string_view s) { return utf8_decode(s, 0, utf8_char_len(s, 0)); }

// Rust's char::is_alphanumeric, approximated by letters, marks of letters and numbers.
bool is_word_char(uint32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  return !is_unicode_whitespace(c) && c != 0xFFFD;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens,
                                     std::vector<std::string> patterns)
    : tokens_(std::move(tokens)), patterns_(std::move(patterns)) {
  for (size_t i = 0; i < patterns_.size(); ++i) {
    if (patterns_[i].empty()) continue;
    by_first_byte_[static_cast<unsigned char>(patterns_[i][0])].push_back(i);
  }
  for (auto& [b, list] : by_first_byte_) {
    std::stable_sort(list.begin(), list.end(), [&](size_t x, size_t y) {
      return patterns_[x].size() > patterns_[y].size();
    });
  }
}

void AddedTokenMatcher::split(std::string_view s, std::vector<Segment>& out) const {
  size_t start_offset = 0;  // the end of the last segment emitted
  size_t i = 0;
  while (i < s.size()) {
    const auto bucket = by_first_byte_.find(static_cast<unsigned char>(s[i]));
    size_t found = SIZE_MAX;
    if (bucket != by_first_byte_.end()) {
      for (size_t k : bucket->second) {
        if (s.compare(i, patterns_[k].size(), patterns_[k]) == 0) {
          found = k;
          break;
        }
      }
    }
    if (found == SIZE_MAX) {
      ++i;
      continue;
    }
    const AddedToken& tok = tokens_[found];
    size_t start = i, stop = i + patterns_[found].size();
    i = stop;  // the next search starts after this match, taken or not
    if (tok.single_word) {
      const bool start_space = start == 0 || !is_word_char(last_char(s.substr(0, start)));
      const bool stop_space = stop == s.size() || !is_word_char(first_char(s.substr(stop)));
      if (!start_space || !stop_space) continue;
    }
    if (tok.lstrip) {
      size_t b = start;
      while (b > 0) {
        size_t p = b - 1;
        while (p > 0 && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80) --p;
        if (!is_unicode_whitespace(utf8_decode(s, p, utf8_char_len(s, p)))) break;
        b = p;
      }
      start = std::max(b, start_offset);
    }
    if (tok.rstrip) {
      while (stop < s.size()) {
        const size_t n = utf8_char_len(s, stop);
        if (!is_unicode_whitespace(utf8_decode(s, stop, n))) break;
        stop += n;
      }
    }
    if (start_offset < start) out.push_back({-1, start_offset, start});
    out.push_back({tok.id, start, stop});
    start_offset = stop;
  }
  if (start_offset < s.size()) out.push_back({-1, start_offset, s.size()});
}

}  // namespace zerod::tokenizer
