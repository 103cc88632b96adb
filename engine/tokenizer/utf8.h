// UTF-8 helpers for the tokenizers. Invalid bytes are not errors here: each counts as one
// character of one byte, so byte-level tokenizers can round-trip any bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace zerod::tokenizer {

// The length of the UTF-8 character starting at s[i] (1 for an invalid or truncated one).
inline size_t utf8_char_len(std::string_view s, size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  size_t n = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 1;
  for (size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 1;
  }
  // Overlong forms, surrogates and code points above U+10FFFF are invalid.
  if (n == 2 && b < 0xC2) return 1;
  const auto b1 = static_cast<unsigned char>(s[i + 1]);
  if (n == 3 && ((b == 0xE0 && b1 < 0xA0) || (b == 0xED && b1 >= 0xA0))) return 1;
  if (n == 4 && ((b == 0xF0 && b1 < 0x90) || b > 0xF4 || (b == 0xF4 && b1 >= 0x90))) return 1;
  return n;
}

// The code point of the character at s[i] of length len (utf8_char_len); an invalid byte
// decodes to 0xFFFD.
inline uint32_t utf8_decode(std::string_view s, size_t i, size_t len) {
  const auto b = static_cast<unsigned char>(s[i]);
  if (len == 1) return b < 0x80 ? b : 0xFFFD;
  uint32_t cp = b & (0xFF >> (len + 1));
  for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return cp;
}

inline void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Whether s is valid UTF-8 as a whole.
inline bool utf8_valid(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_char_len(s, i);
    if (n == 1 && static_cast<unsigned char>(s[i]) >= 0x80) return false;
    i += n;
  }
  return true;
}

// Unicode White_Space (Rust's char::is_whitespace, Oniguruma's \s).
inline bool is_unicode_whitespace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

}  // namespace zerod::tokenizer
