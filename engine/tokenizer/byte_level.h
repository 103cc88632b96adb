// GPT-2's byte-to-unicode mapping: each of the 256 bytes as a printable character (the
// printable Latin-1 bytes as themselves, the others as U+0100 upwards), so byte-level BPE
// vocabularies are text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace zerod::tokenizer {

// Appends the mapped characters of every byte of bytes to out.
void bytes_to_unicode(std::string_view bytes, std::string& out);
// The byte a mapped code point stands for, or -1 when cp is not one of the 256.
int unicode_to_byte(uint32_t cp);

}  // namespace zerod::tokenizer
