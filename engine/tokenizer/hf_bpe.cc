#include "engine/tokenizer/hf_bpe.h"

#include <fstream>
#include <sstream>

#include "core/error.h"

namespace zerod::tokenizer {

HfBpeTokenizer::HfBpeTokenizer(HfBpeParts parts) : parts_(std::move(parts)) {
  vocab_size_ = parts_.model->max_id() + 1;
  std::vector<AddedToken> raw, normalized;
  std::vector<std::string> raw_patterns, normalized_patterns;
  for (const AddedToken& t : parts_.added) {
    added_by_id_[t.id] = t.content;
    added_by_content_[t.content] = t.id;
    vocab_size_ = std::max(vocab_size_, t.id + 1);
    if (t.special) specials_.push_back({t.content, t.id});
    if (t.normalized) {
      std::string pattern = t.content;
      if (parts_.normalizer) parts_.normalizer->normalize(pattern);
      normalized.push_back(t);
      normalized_patterns.push_back(std::move(pattern));
    } else {
      raw.push_back(t);
      raw_patterns.push_back(t.content);
    }
  }
  if (!raw.empty()) raw_matcher_ = std::make_unique<AddedTokenMatcher>(raw, raw_patterns);
  if (!normalized.empty()) {
    normalized_matcher_ = std::make_unique<AddedTokenMatcher>(normalized, normalized_patterns);
  }
  // BOS/EOS: tokenizer_config.json's, else the post-processor's, else a well-known name.
  auto lookup = [&](const std::string& name) { return name.empty() ? std::nullopt : token_to_id(name); };
  bos_ = lookup(parts_.bos_token);
  eos_ = lookup(parts_.eos_token);
  if (!bos_ && !parts_.prefix.empty()) bos_ = parts_.prefix.front();
  if (!eos_ && !parts_.suffix.empty()) eos_ = parts_.suffix.back();
  for (const char* name : {"<s>", "<|begin_of_text|>", "<|endoftext|>"}) {
    if (!bos_) bos_ = token_to_id(name);
  }
  for (const char* name : {"</s>", "<|end_of_text|>", "<|endoftext|>"}) {
    if (!eos_) eos_ = token_to_id(name);
  }
  policy_.add_bos = !parts_.prefix.empty() && bos_;
  policy_.add_eos = !parts_.suffix.empty() && eos_;
}

std::optional<int32_t> HfBpeTokenizer::token_to_id(std::string_view token) const {
  if (const auto it = added_by_content_.find(std::string(token)); it != added_by_content_.end()) {
    return it->second;
  }
  return parts_.model->token_to_id(token);
}

std::optional<std::string> HfBpeTokenizer::id_to_token(int32_t id) const {
  if (const auto it = added_by_id_.find(id); it != added_by_id_.end()) return it->second;
  if (const std::string* t = parts_.model->id_to_token(id)) return *t;
  return std::nullopt;
}

std::vector<int32_t> HfBpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (!raw_matcher_) {
    encode_normalized(text, true, out);
    return out;
  }
  std::vector<Segment> segments;
  raw_matcher_->split(text, segments);
  for (const Segment& s : segments) {
    if (s.id >= 0) out.push_back(s.id);
    else encode_normalized(text.substr(s.begin, s.end - s.begin), s.begin == 0, out);
  }
  return out;
}

void HfBpeTokenizer::encode_normalized(std::string_view text, bool at_start,
                                       std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::string normalized(text);
  if (parts_.normalizer) parts_.normalizer->normalize(normalized);
  std::vector<Piece> pieces;
  if (normalized_matcher_) {
    std::vector<Segment> segments;
    normalized_matcher_->split(normalized, segments);
    for (const Segment& s : segments) {
      if (s.id >= 0) {
        out.push_back(s.id);
        continue;
      }
      pieces.clear();
      pieces.push_back({normalized.substr(s.begin, s.end - s.begin), at_start && s.begin == 0});
      if (parts_.pre_tokenizer) parts_.pre_tokenizer->pre_tokenize(pieces);
      for (const Piece& p : pieces) parts_.model->tokenize(p.text, out);
    }
    return;
  }
  pieces.push_back({std::move(normalized), at_start});
  if (parts_.pre_tokenizer) parts_.pre_tokenizer->pre_tokenize(pieces);
  for (const Piece& p : pieces) parts_.model->tokenize(p.text, out);
}

std::string HfBpeTokenizer::decode(std::span<const int32_t> ids) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (auto t = id_to_token(id)) tokens.push_back(std::move(*t));
  }
  if (!parts_.decoder) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  parts_.decoder->decode_chain(tokens);
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

}  // namespace zerod::tokenizer
