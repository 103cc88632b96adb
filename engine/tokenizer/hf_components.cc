#include "engine/tokenizer/hf_components.h"

#include <optional>

#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/regex.h"
#include "engine/tokenizer/unicode_normalize.h"
#include "engine/tokenizer/utf8.h"

namespace zerod::tokenizer {
namespace {

using Spans = std::vector<std::pair<size_t, size_t>>;

// A Split or Replace pattern: {"String": "literal"} or {"Regex": "..."}.
class Pattern {
 public:
  explicit Pattern(const JsonAt& j) {
    j.expect_object();
    if (j.has("String")) {
      literal_ = j["String"].str();
    } else if (j.has("Regex")) {
      regex_ = std::make_unique<Regex>(j["Regex"].str(), j.file + ": " + j.path + "/Regex");
    } else {
      j.fail("expected {\"String\": ...} or {\"Regex\": ...}");
    }
  }
  explicit Pattern(std::string literal) : literal_(std::move(literal)) {}

  // Non-overlapping matches, left to right.
  void find(std::string_view text, Spans& out) const {
    if (regex_) return regex_->find_all(text, out);
    if (literal_.empty()) return;
    for (size_t pos = text.find(literal_); pos != std::string_view::npos;
         pos = text.find(literal_, pos + literal_.size())) {
      out.emplace_back(pos, pos + literal_.size());
    }
  }

 private:
  std::string literal_;
  std::unique_ptr<Regex> regex_;
};

void replace_all(std::string& s, const Pattern& pattern, std::string_view content) {
  Spans spans;
  pattern.find(s, spans);
  if (spans.empty()) return;
  std::string out;
  size_t prev = 0;
  for (const auto& [b, e] : spans) {
    out.append(s, prev, b - prev);
    out += content;
    prev = e;
  }
  out.append(s, prev);
  s = std::move(out);
}

// ---------------------------------------------------------------------------------------------
// Normalizers

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts)
      : parts_(std::move(parts)) {}
  void normalize(std::string& s) const override {
    for (const auto& p : parts_) p->normalize(s);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(const JsonAt& j) : pattern_(j["pattern"]), content_(j["content"].str()) {}
  void normalize(std::string& s) const override { replace_all(s, pattern_, content_); }

 private:
  Pattern pattern_;
  std::string content_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prepend) : prepend_(std::move(prepend)) {}
  void normalize(std::string& s) const override {
    if (!s.empty()) s = prepend_ + s;
  }

 private:
  std::string prepend_;
};

class UnicodeNormalizer : public Normalizer {
 public:
  explicit UnicodeNormalizer(UnicodeForm form) : form_(form) {}
  void normalize(std::string& s) const override { s = unicode_normalize(s, form_); }

 private:
  UnicodeForm form_;
};

// ---------------------------------------------------------------------------------------------
// Pre-tokenizers

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Behavior parse_behavior(const JsonAt& j) {
  const std::string b = j.str();
  if (b == "Removed") return Behavior::kRemoved;
  if (b == "Isolated") return Behavior::kIsolated;
  if (b == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::kMergedWithNext;
  if (b == "Contiguous") return Behavior::kContiguous;
  j.fail("expected one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous");
}

// tokenizers' NormalizedString::split: the pattern's matches and the stretches between them,
// grouped by behavior, appended to out as pieces.
void split_piece(const Piece& piece, const Pattern& pattern, Behavior behavior, bool invert,
                 std::vector<Piece>& out) {
  const std::string& s = piece.text;
  if (s.empty()) return;
  Spans spans;
  pattern.find(s, spans);
  struct Part {
    size_t b, e;
    bool match;
  };
  std::vector<Part> parts;
  size_t prev = 0;
  for (const auto& [b, e] : spans) {
    if (prev != b) parts.push_back({prev, b, invert});
    parts.push_back({b, e, !invert});
    prev = e;
  }
  if (prev != s.size()) parts.push_back({prev, s.size(), invert});

  std::vector<Part> kept;  // match: here "remove"
  switch (behavior) {
    case Behavior::kIsolated:
      for (Part p : parts) kept.push_back({p.b, p.e, false});
      break;
    case Behavior::kRemoved:
      for (Part p : parts) kept.push_back(p);
      break;
    case Behavior::kContiguous: {
      bool previous = false;
      for (Part p : parts) {
        if (p.match == previous && !kept.empty()) kept.back().e = p.e;
        else kept.push_back({p.b, p.e, false});
        previous = p.match;
      }
      break;
    }
    case Behavior::kMergedWithPrevious: {
      bool previous = false;
      for (Part p : parts) {
        if (p.match && !previous && !kept.empty()) kept.back().e = p.e;
        else kept.push_back({p.b, p.e, false});
        previous = p.match;
      }
      break;
    }
    case Behavior::kMergedWithNext: {
      bool previous = false;
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->match && !previous && !kept.empty()) kept.back().b = it->b;
        else kept.push_back({it->b, it->e, false});
        previous = it->match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    }
  }
  for (const Part& p : kept) {
    if (p.match || p.e == p.b) continue;
    out.push_back({s.substr(p.b, p.e - p.b), piece.at_start && p.b == 0});
  }
}

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts)
      : parts_(std::move(parts)) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (const auto& p : parts_) p->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

class SplitPreTokenizer : public PreTokenizer {
 public:
  explicit SplitPreTokenizer(const JsonAt& j)
      : pattern_(j["pattern"]),
        behavior_(parse_behavior(j["behavior"])),
        invert_(j.bool_or("invert", false)) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    out.reserve(pieces.size());
    for (const Piece& p : pieces) split_piece(p, pattern_, behavior_, invert_, out);
    pieces = std::move(out);
  }

 private:
  Pattern pattern_;
  Behavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  explicit ByteLevelPreTokenizer(const JsonAt& j)
      : add_prefix_space_(j.bool_or("add_prefix_space", true)),
        use_regex_(j.bool_or("use_regex", true)) {
    if (use_regex_) regex_ = std::make_unique<Regex>(kGpt2Pattern, j.file + ": " + j.path);
  }
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    out.reserve(pieces.size() * 2);
    Spans spans;
    for (Piece& p : pieces) {
      if (p.text.empty()) continue;
      if (add_prefix_space_ && p.text[0] != ' ') p.text = " " + p.text;
      if (!use_regex_) {
        out.push_back({"", p.at_start});
        bytes_to_unicode(p.text, out.back().text);
        continue;
      }
      spans.clear();
      regex_->find_all(p.text, spans);
      size_t prev = 0;
      auto emit = [&](size_t b, size_t e) {
        out.push_back({"", p.at_start && b == 0});
        bytes_to_unicode(std::string_view(p.text).substr(b, e - b), out.back().text);
      };
      for (const auto& [b, e] : spans) {
        if (prev != b) emit(prev, b);
        emit(b, e);
        prev = e;
      }
      if (prev != p.text.size()) emit(prev, p.text.size());
    }
    pieces = std::move(out);
  }

 private:
  bool add_prefix_space_, use_regex_;
  std::unique_ptr<Regex> regex_;
};

enum class PrependScheme { kAlways, kFirst, kNever };

PrependScheme parse_prepend_scheme(const JsonAt& j) {
  if (j.has_value("prepend_scheme")) {
    const std::string s = j["prepend_scheme"].str();
    if (s == "always") return PrependScheme::kAlways;
    if (s == "first") return PrependScheme::kFirst;
    if (s == "never") return PrependScheme::kNever;
    j["prepend_scheme"].fail("expected always, first or never");
  }
  return j.bool_or("add_prefix_space", true) ? PrependScheme::kAlways : PrependScheme::kNever;
}

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  explicit MetaspacePreTokenizer(const JsonAt& j)
      : replacement_(j.str_or("replacement", "\u2581")),
        scheme_(parse_prepend_scheme(j)),
        split_(j.bool_or("split", true)),
        pattern_(replacement_) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    for (Piece& p : pieces) {
      if (p.text.empty()) continue;
      replace_all(p.text, Pattern(" "), replacement_);
      const bool starts = p.text.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (scheme_ == PrependScheme::kAlways ||
                      (scheme_ == PrependScheme::kFirst && p.at_start))) {
        p.text = replacement_ + p.text;
      }
      if (split_) split_piece(p, pattern_, Behavior::kMergedWithNext, false, out);
      else out.push_back(std::move(p));
    }
    pieces = std::move(out);
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
  Pattern pattern_;
};

// ---------------------------------------------------------------------------------------------
// Decoders

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& p : parts_) p->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

// The mapped characters back to bytes; a token with a character outside the mapping stays as
// it is. The bytes are kept as they are (no U+FFFD for invalid UTF-8): see Tokenizer::decode.
class ByteLevelDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const std::string& t : tokens) {
      const size_t start = bytes.size();
      bool all = true;
      for (size_t i = 0; i < t.size() && all;) {
        const size_t n = utf8_char_len(t, i);
        const int b = unicode_to_byte(utf8_decode(t, i, n));
        if (b < 0 || (n == 1 && static_cast<unsigned char>(t[i]) >= 0x80)) all = false;
        else bytes += static_cast<char>(b);
        i += n;
      }
      if (!all) {
        bytes.resize(start);
        bytes += t;
      }
    }
    tokens.assign(1, std::move(bytes));
  }
};

class ReplaceDecoder : public Decoder {
 public:
  explicit ReplaceDecoder(const JsonAt& j) : pattern_(j["pattern"]), content_(j["content"].str()) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) replace_all(t, pattern_, content_);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class ByteFallbackDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (utf8_valid(pending)) out.push_back(pending);
      else for (size_t i = 0; i < pending.size(); ++i) out.emplace_back("\uFFFD");
      pending.clear();
    };
    for (std::string& t : tokens) {
      std::optional<int> byte;
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
        int v = 0;
        bool ok = true;
        for (char c : std::string_view(t).substr(3, 2)) {
          const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                               : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
          ok = ok && d >= 0;
          v = v * 16 + d;
        }
        if (ok) byte = v;
      }
      if (byte) {
        pending += static_cast<char>(*byte);
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }
};

class FuseDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const std::string& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

// Strips up to start leading and stop trailing copies of one character from each token.
class StripDecoder : public Decoder {
 public:
  explicit StripDecoder(const JsonAt& j)
      : content_(j["content"].str()), start_(j.int_or("start", 0)), stop_(j.int_or("stop", 0)) {
    const size_t n = content_.empty() ? 0 : utf8_char_len(content_, 0);
    if (n != content_.size()) j["content"].fail("expected one character");
  }
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      std::vector<std::pair<size_t, size_t>> chars;  // (offset, length)
      for (size_t i = 0; i < t.size(); i += chars.back().second) chars.emplace_back(i, utf8_char_len(t, i));
      auto is_content = [&](size_t k) {
        return t.compare(chars[k].first, chars[k].second, content_) == 0;
      };
      size_t first = 0, last = chars.size();
      for (size_t k = 0; k < chars.size() && k < static_cast<size_t>(start_) && is_content(k); ++k) first = k + 1;
      for (int64_t k = 0; k < stop_ && last > 0; ++k) {
        if (!is_content(last - 1)) break;
        --last;
      }
      if (first >= last) {
        t.clear();
        continue;
      }
      const size_t b = chars[first].first, e = last == chars.size() ? t.size() : chars[last].first;
      t = t.substr(b, e - b);
    }
  }

 private:
  std::string content_;
  int64_t start_, stop_;
};

class MetaspaceDecoder : public Decoder {
 public:
  explicit MetaspaceDecoder(const JsonAt& j)
      : replacement_(j.str_or("replacement", "\u2581")), scheme_(parse_prepend_scheme(j)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& t = tokens[i];
      for (size_t k = 0; k < t.size();) {
        if (!replacement_.empty() && t.compare(k, replacement_.size(), replacement_) == 0) {
          if (!(i == 0 && scheme_ != PrependScheme::kNever)) out += ' ';
          k += replacement_.size();
        } else {
          out += t[k++];
        }
      }
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
};

std::string type_of(const JsonAt& j) {
  j.expect_object();
  return j["type"].str();
}

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const JsonAt& j) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j);
  if (type == "Sequence") {
    const JsonAt list = j["normalizers"];
    list.expect_array();
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (size_t i = 0; i < list.j.size(); ++i) {
      if (auto p = make_normalizer(list.at(i))) parts.push_back(std::move(p));
    }
    return std::make_unique<SequenceNormalizer>(std::move(parts));
  }
  if (type == "Replace") return std::make_unique<ReplaceNormalizer>(j);
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(j["prepend"].str());
  for (const UnicodeForm form :
       {UnicodeForm::kNfc, UnicodeForm::kNfd, UnicodeForm::kNfkc, UnicodeForm::kNfkd}) {
    if (type != unicode_form_name(form)) continue;
    if (!unicode_normalization_built()) {
      ZD_THROW_INPUT(
          "{}: {}/type: the normalizer {:?} needs utf8proc, which this zerod was built "
          "without (tools/deps.sh installs libutf8proc-dev)",
          j.file, j.path, type);
    }
    return std::make_unique<UnicodeNormalizer>(form);
  }
  ZD_THROW_INPUT(
      "{}: {}/type: the normalizer {:?} is not supported (supported: Sequence, "
      "Replace, Prepend, NFC, NFD, NFKC, NFKD)",
      j.file, j.path, type);
}

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const JsonAt& j) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j);
  if (type == "Sequence") {
    const JsonAt list = j["pretokenizers"];
    list.expect_array();
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (size_t i = 0; i < list.j.size(); ++i) {
      if (auto p = make_pre_tokenizer(list.at(i))) parts.push_back(std::move(p));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(parts));
  }
  if (type == "Split") return std::make_unique<SplitPreTokenizer>(j);
  if (type == "ByteLevel") return std::make_unique<ByteLevelPreTokenizer>(j);
  if (type == "Metaspace") return std::make_unique<MetaspacePreTokenizer>(j);
  ZD_THROW_INPUT("{}: {}/type: the pre-tokenizer {:?} is not supported (supported: Sequence, "
                 "Split, ByteLevel, Metaspace)",
                 j.file, j.path, type);
}

std::unique_ptr<Decoder> make_decoder(const JsonAt& j) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j);
  if (type == "Sequence") {
    const JsonAt list = j["decoders"];
    list.expect_array();
    std::vector<std::unique_ptr<Decoder>> parts;
    for (size_t i = 0; i < list.j.size(); ++i) {
      if (auto p = make_decoder(list.at(i))) parts.push_back(std::move(p));
    }
    return std::make_unique<SequenceDecoder>(std::move(parts));
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Replace") return std::make_unique<ReplaceDecoder>(j);
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") return std::make_unique<StripDecoder>(j);
  if (type == "Metaspace") return std::make_unique<MetaspaceDecoder>(j);
  ZD_THROW_INPUT("{}: {}/type: the decoder {:?} is not supported (supported: Sequence, ByteLevel, "
                 "Replace, ByteFallback, Fuse, Strip, Metaspace)",
                 j.file, j.path, type);
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_char_len(s, i);
    const auto b = static_cast<unsigned char>(s[i]);
    if (n > 1 || b < 0x80) {
      out.append(s.substr(i, n));
      i += n;
      continue;
    }
    // The longest prefix of a valid sequence starting at i is one replacement character.
    size_t want = (b >= 0xC2 && b <= 0xDF) ? 2 : (b >= 0xE0 && b <= 0xEF) ? 3
                  : (b >= 0xF0 && b <= 0xF4) ? 4 : 1;
    size_t k = 1;
    for (; k < want && i + k < s.size(); ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      unsigned lo = 0x80, hi = 0xBF;
      if (k == 1) {
        if (b == 0xE0) lo = 0xA0;
        if (b == 0xED) hi = 0x9F;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;
      }
      if (c < lo || c > hi) break;
    }
    out += "\uFFFD";
    i += k;
  }
  return out;
}

}  // namespace zerod::tokenizer
