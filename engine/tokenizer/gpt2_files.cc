// GPT-2's vocab.json + merges.txt: the byte-level BPE of hf_bpe.h with GPT-2's pre-tokenizer
// (ByteLevel, no prefix space, GPT-2's pattern) and decoder.
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "engine/tokenizer/hf_bpe.h"

namespace zerod::tokenizer {

std::unique_ptr<Tokenizer> load_gpt2_files(const std::filesystem::path& vocab_json,
                                           const std::filesystem::path& merges_txt) {
  const std::string vname = vocab_json.string(), mname = merges_txt.string();
  std::ifstream vin(vocab_json, std::ios::binary);
  ZD_CHECK_INPUT(vin.good(), "{}: cannot open the file", vname);
  std::ifstream min(merges_txt, std::ios::binary);
  ZD_CHECK_INPUT(min.good(), "{}: cannot open the merges file beside {} (GPT-2's tokenizer is "
                 "vocab.json + merges.txt)", mname, vname);
  std::stringstream buf;
  buf << vin.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(buf.str());
  } catch (const nlohmann::json::parse_error& e) {
    ZD_THROW_INPUT("{}: not valid JSON: {}", vname, e.what());
  }
  const JsonAt root{j, "", vname};
  root.expect_object();
  Vocab vocab;
  vocab.reserve(j.size());
  for (auto it = j.begin(); it != j.end(); ++it) {
    const int64_t id = root[it.key()].integer();
    if (id < 0 || id > INT32_MAX) root[it.key()].fail("expected an id in [0, 2^31)");
    vocab.emplace(it.key(), static_cast<int32_t>(id));
  }
  // merges.txt: "#version: ..." first, then "a b" a line (tokenizers' convert_merges_to_hashmap).
  std::vector<std::pair<std::string, std::string>> merges;
  std::string line;
  for (size_t n = 1; std::getline(min, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.rfind("#version", 0) == 0 || line.empty()) continue;
    const size_t space = line.find(' ');
    ZD_CHECK_INPUT(space != std::string::npos && line.find(' ', space + 1) == std::string::npos,
                   "{}:{}: expected \"A B\" (two tokens and one space), found {:?}", mname, n, line);
    merges.emplace_back(line.substr(0, space), line.substr(space + 1));
  }
  const bool has_eot = vocab.contains("<|endoftext|>");
  HfBpeParts parts;
  parts.model = std::make_unique<BpeModel>(std::move(vocab), merges, BpeOptions{}, mname);
  if (has_eot) {
    AddedToken eot{"<|endoftext|>", *parts.model->token_to_id("<|endoftext|>"), true};
    parts.added.push_back(eot);
    parts.bos_token = parts.eos_token = eot.content;
  }
  static const nlohmann::json kPre = {{"type", "ByteLevel"}, {"add_prefix_space", false},
                                      {"use_regex", true}};
  static const nlohmann::json kDec = {{"type", "ByteLevel"}};
  parts.pre_tokenizer = make_pre_tokenizer(JsonAt{kPre, "/pre_tokenizer", vname});
  parts.decoder = make_decoder(JsonAt{kDec, "/decoder", vname});
  parts.description = fmt::format("GPT-2 vocab.json + merges.txt (byte-level BPE, {} tokens)",
                                  parts.model->max_id() + 1);
  return std::make_unique<HfBpeTokenizer>(std::move(parts));
}

}  // namespace zerod::tokenizer
