// Unicode normalization forms (tokenizer.json's NFC, NFD, NFKC and NFKD normalizers: Qwen2's
// tokenizer is NFC) on utf8proc. Text that is not valid UTF-8 keeps its invalid bytes as they
// are and normalizes the valid runs between them (the Python libraries only see valid text).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace zerod::tokenizer {

enum class UnicodeForm : uint8_t { kNfc, kNfd, kNfkc, kNfkd };

// "NFC", "NFD", "NFKC", "NFKD".
const char* unicode_form_name(UnicodeForm f);

// Whether this build has utf8proc; without it unicode_normalize throws and tokenizer.json files
// with these normalizers are refused.
bool unicode_normalization_built();

std::string unicode_normalize(std::string_view s, UnicodeForm form);

}  // namespace zerod::tokenizer
