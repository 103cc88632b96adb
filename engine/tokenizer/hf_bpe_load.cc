// Parsing tokenizer.json (and tokenizer_config.json beside it) into HfBpeParts.
#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "engine/tokenizer/hf_bpe.h"

namespace zerod::tokenizer {
namespace {

nlohmann::json read_json(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  ZD_CHECK_INPUT(in.good(), "{}: cannot open the file", file.string());
  std::stringstream buf;
  buf << in.rdbuf();
  try {
    return nlohmann::json::parse(buf.str());
  } catch (const nlohmann::json::parse_error& e) {
    ZD_THROW_INPUT("{}: not valid JSON: {}", file.string(), e.what());
  }
}

std::vector<std::pair<std::string, std::string>> parse_merges(const JsonAt& list) {
  list.expect_array();
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(list.j.size());
  for (size_t i = 0; i < list.j.size(); ++i) {
    const JsonAt m = list.at(i);
    if (m.j.is_string()) {  // "a b" (tokenizers before 0.20)
      const std::string s = m.str();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        m.fail("expected \"A B\" (two tokens and one space)");
      }
      merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (m.j.is_array() && m.j.size() == 2) {  // ["a", "b"]
      merges.emplace_back(m.at(0).str(), m.at(1).str());
    } else {
      m.fail("expected a merge, \"A B\" or [\"A\", \"B\"]");
    }
  }
  return merges;
}

std::unique_ptr<BpeModel> parse_model(const JsonAt& m) {
  m.expect_object();
  const std::string type = m.str_or("type", "BPE");
  if (type != "BPE") {
    ZD_THROW_INPUT("{}: /model/type: the model {:?} is not supported (supported: BPE; "
                   "SentencePiece Unigram models load from their .model file)",
                   m.file, type);
  }
  if (m.has_value("dropout")) {
    const auto& d = m["dropout"].j;
    ZD_CHECK_INPUT(d.is_number() && d.get<double>() == 0.0,
                   "{}: /model/dropout: BPE dropout is not supported (training-time only)", m.file);
  }
  const JsonAt vocab_json = m["vocab"];
  vocab_json.expect_object();
  Vocab vocab;
  vocab.reserve(vocab_json.j.size());
  for (auto it = vocab_json.j.begin(); it != vocab_json.j.end(); ++it) {
    const JsonAt id = vocab_json[it.key()];
    const int64_t v = id.integer();
    if (v < 0 || v > INT32_MAX) id.fail("expected an id in [0, 2^31)");
    vocab.emplace(it.key(), static_cast<int32_t>(v));
  }
  BpeOptions options;
  options.byte_fallback = m.bool_or("byte_fallback", false);
  options.fuse_unk = m.bool_or("fuse_unk", false);
  options.ignore_merges = m.bool_or("ignore_merges", false);
  options.continuing_subword_prefix = m.str_or("continuing_subword_prefix", "");
  options.end_of_word_suffix = m.str_or("end_of_word_suffix", "");
  if (m.has_value("unk_token")) options.unk_token = m["unk_token"].str();
  const auto merges = m.has("merges") ? parse_merges(m["merges"])
                                      : std::vector<std::pair<std::string, std::string>>{};
  return std::make_unique<BpeModel>(std::move(vocab), merges, std::move(options),
                                    m.file + ": /model");
}

// The ids the post-processor puts before and after a single sequence.
void parse_post_processor(const JsonAt& p, HfBpeParts& parts) {
  if (p.is_null()) return;
  p.expect_object();
  const std::string type = p["type"].str();
  auto id_of = [&](const JsonAt& pair) {  // ["<s>", 1]
    pair.expect_array();
    if (pair.j.size() != 2) pair.fail("expected [token, id]");
    return static_cast<int32_t>(pair.at(1).integer());
  };
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    const JsonAt list = p["processors"];
    list.expect_array();
    for (size_t i = 0; i < list.j.size(); ++i) parse_post_processor(list.at(i), parts);
    return;
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    parts.prefix.push_back(id_of(p["cls"]));
    parts.suffix.push_back(id_of(p["sep"]));
    return;
  }
  if (type == "TemplateProcessing") {
    const JsonAt single = p["single"];
    single.expect_array();
    const JsonAt specials = p["special_tokens"];
    bool seen_sequence = false;
    for (size_t i = 0; i < single.j.size(); ++i) {
      const JsonAt item = single.at(i);
      if (item.has("Sequence")) {
        seen_sequence = true;
        continue;
      }
      const std::string name = item["SpecialToken"]["id"].str();
      const JsonAt ids = specials[name]["ids"];
      ids.expect_array();
      for (size_t k = 0; k < ids.j.size(); ++k) {
        (seen_sequence ? parts.suffix : parts.prefix).push_back(static_cast<int32_t>(ids.at(k).integer()));
      }
    }
    return;
  }
  ZD_THROW_INPUT("{}: /post_processor/type: the post-processor {:?} is not supported (supported: "
                 "TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing, Sequence)",
                 p.file, type);
}

// tokenizer_config.json's bos_token / eos_token: a string or {"content": ...}.
void read_config(const std::filesystem::path& dir, HfBpeParts& parts) {
  const auto file = dir / "tokenizer_config.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) return;
  const nlohmann::json j = read_json(file);
  const std::string name = file.string();
  const JsonAt root{j, "", name};
  root.expect_object();
  for (auto [key, out] : {std::pair{"bos_token", &parts.bos_token}, {"eos_token", &parts.eos_token}}) {
    if (!root.has_value(key)) continue;
    const JsonAt v = root[key];
    *out = v.j.is_string() ? v.str() : v["content"].str();
  }
}

}  // namespace

std::unique_ptr<Tokenizer> load_hf_tokenizer_json(const std::filesystem::path& file) {
  const nlohmann::json j = read_json(file);
  const std::string name = file.string();
  const JsonAt root{j, "", name};
  root.expect_object();
  HfBpeParts parts;
  parts.model = parse_model(root["model"]);
  if (root.has_value("added_tokens")) {
    const JsonAt list = root["added_tokens"];
    list.expect_array();
    for (size_t i = 0; i < list.j.size(); ++i) {
      const JsonAt t = list.at(i);
      AddedToken a;
      a.content = t["content"].str();
      const int64_t id = t["id"].integer();
      if (id < 0 || id > INT32_MAX) t["id"].fail("expected an id in [0, 2^31)");
      a.id = static_cast<int32_t>(id);
      a.special = t.bool_or("special", false);
      a.single_word = t.bool_or("single_word", false);
      a.lstrip = t.bool_or("lstrip", false);
      a.rstrip = t.bool_or("rstrip", false);
      a.normalized = t.bool_or("normalized", !a.special);
      if (a.content.empty()) t["content"].fail("expected a non-empty token");
      parts.added.push_back(std::move(a));
    }
  }
  static const nlohmann::json kNull;
  auto optional = [&](std::string_view key) {
    return root.has(key) ? root[key] : JsonAt{kNull, "/" + std::string(key), name};
  };
  parts.normalizer = make_normalizer(optional("normalizer"));
  parts.pre_tokenizer = make_pre_tokenizer(optional("pre_tokenizer"));
  parts.decoder = make_decoder(optional("decoder"));
  parse_post_processor(optional("post_processor"), parts);
  read_config(file.parent_path(), parts);
  const JsonAt model = root["model"];
  std::string kind = "SentencePiece-style";
  if (model.bool_or("byte_fallback", false)) kind += ", byte_fallback";
  if (root.has_value("pre_tokenizer") &&
      j["pre_tokenizer"].dump().find("\"ByteLevel\"") != std::string::npos) {
    kind = "byte-level";
  }
  parts.description = fmt::format("tokenizer.json (BPE, {}, {} tokens)", kind,
                                  parts.model->max_id() + 1);
  return std::make_unique<HfBpeTokenizer>(std::move(parts));
}

}  // namespace zerod::tokenizer
