#include "engine/tokenizer/regex.h"

#include "core/error.h"
#include "engine/tokenizer/utf8.h"

#ifdef ZEROD_HAVE_PCRE2
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#endif

namespace zerod::tokenizer {

namespace {
// Unicode White_Space, as members of a character class.
constexpr std::string_view kWhiteSpace =
    R"(\t\n\x0B\f\r\x20\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
}  // namespace

std::string translate_pattern(std::string_view p) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[++i];
      if (n == 's') {
        out += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      } else if (n == 'S' && !in_class) {
        out += "[^" + std::string(kWhiteSpace) + "]";
      } else {
        out += c;
        out += n;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' first in a class (after an optional '^') is a literal.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:]
      const size_t end = p.find(":]", i + 2);
      if (end != std::string_view::npos) {
        out += p.substr(i, end + 2 - i);
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

#ifdef ZEROD_HAVE_PCRE2

struct Regex::Impl {
  pcre2_code* code = nullptr;
  ~Impl() {
    if (code) pcre2_code_free(code);
  }
};

namespace {
// Per-thread match state: the JIT stack grows to 8 MiB for long whitespace runs.
struct MatchState {
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  MatchState() {
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
  }
};
}  // namespace

Regex::Regex(std::string_view pattern, std::string_view what)
    : impl_(std::make_unique<Impl>()), pattern_(translate_pattern(pattern)) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_.data()), pattern_.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset,
                              nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    ZD_THROW_INPUT("{}: the regular expression {:?} does not compile: {} (at offset {})", what,
                   std::string(pattern), reinterpret_cast<const char*>(message), offset);
  }
  pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);  // without JIT PCRE2 interprets
}

Regex::~Regex() = default;

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  thread_local MatchState state;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(impl_->code, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    const int rc = pcre2_match(impl_->code, subject, text.size(), pos, 0, md, state.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      pcre2_match_data_free(md);
      ZD_THROW("pcre2_match failed on a text of {} bytes: {}", text.size(),
               reinterpret_cast<const char*>(message));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    if (ov[1] == ov[0]) {
      pos = ov[0] + utf8_char_len(text, ov[0]);
      continue;
    }
    out.emplace_back(ov[0], ov[1]);
    pos = ov[1];
  }
  pcre2_match_data_free(md);
}

#else  // no PCRE2

struct Regex::Impl {};

Regex::Regex(std::string_view, std::string_view what) {
  ZD_THROW_INPUT(
      "{}: regular expressions need PCRE2, and this zerod was built without it (install "
      "libpcre2-dev, tools/deps.sh does, and rebuild)",
      what);
}

Regex::~Regex() = default;

void Regex::find_all(std::string_view, std::vector<std::pair<size_t, size_t>>&) const {}

#endif

}  // namespace zerod::tokenizer
