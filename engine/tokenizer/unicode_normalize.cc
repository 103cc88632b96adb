#include "engine/tokenizer/unicode_normalize.h"

#include <cstdlib>

#include "core/error.h"
#include "engine/tokenizer/utf8.h"

#ifdef ZEROD_HAVE_UTF8PROC
#include <utf8proc.h>
#endif

namespace zerod::tokenizer {

const char* unicode_form_name(UnicodeForm f) {
  switch (f) {
    case UnicodeForm::kNfc:
      return "NFC";
    case UnicodeForm::kNfd:
      return "NFD";
    case UnicodeForm::kNfkc:
      return "NFKC";
    case UnicodeForm::kNfkd:
      return "NFKD";
  }
  return "?";
}

#ifdef ZEROD_HAVE_UTF8PROC

bool unicode_normalization_built() {
  return true;
}

namespace {

// One run of valid UTF-8 through utf8proc_map (which refuses invalid input).
void normalize_run(std::string_view run, UnicodeForm form, std::string& out) {
  if (run.empty()) return;
  int options = UTF8PROC_STABLE;
  options |= (form == UnicodeForm::kNfc || form == UnicodeForm::kNfkc) ? UTF8PROC_COMPOSE
                                                                       : UTF8PROC_DECOMPOSE;
  if (form == UnicodeForm::kNfkc || form == UnicodeForm::kNfkd) options |= UTF8PROC_COMPAT;
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(run.data()),
                                          static_cast<utf8proc_ssize_t>(run.size()), &dst,
                                          static_cast<utf8proc_option_t>(options));
  if (n < 0) {
    std::free(dst);
    ZD_THROW("{} normalization of {} bytes failed: {}", unicode_form_name(form), run.size(),
             utf8proc_errmsg(n));
  }
  out.append(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
  std::free(dst);
}

}  // namespace

std::string unicode_normalize(std::string_view s, UnicodeForm form) {
  std::string out;
  out.reserve(s.size());
  size_t run = 0, i = 0;
  while (i < s.size()) {
    const size_t len = utf8_char_len(s, i);
    if (len == 1 && static_cast<unsigned char>(s[i]) >= 0x80) {  // an invalid byte stays
      normalize_run(s.substr(run, i - run), form, out);
      out += s[i];
      run = i + 1;
    }
    i += len;
  }
  normalize_run(s.substr(run), form, out);
  return out;
}

#else

bool unicode_normalization_built() {
  return false;
}

std::string unicode_normalize(std::string_view, UnicodeForm form) {
  ZD_THROW_INPUT(
      "the {} normalizer needs utf8proc, which this zerod was built without "
      "(tools/deps.sh installs libutf8proc-dev)",
      unicode_form_name(form));
}

#endif

}  // namespace zerod::tokenizer
