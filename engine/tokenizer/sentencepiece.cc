// SentencePiece .model files (unigram and BPE) through libsentencepiece, as the Python
// sentencepiece package encodes them. Without the library in the build, loading one is an
// InputError.
#include <fmt/format.h>

#include "core/error.h"
#include "engine/tokenizer/tokenizer.h"

#ifdef ZEROD_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

namespace zerod::tokenizer {

std::unique_ptr<Tokenizer> load_sentencepiece(const std::filesystem::path& file);

#ifdef ZEROD_HAVE_SENTENCEPIECE

namespace {

class SentencePieceTokenizer : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::filesystem::path& file) {
    const auto status = sp_.Load(file.string());
    ZD_CHECK_INPUT(status.ok(), "{}: not a SentencePiece model: {}", file.string(),
                   status.ToString());
    for (int id = 0; id < sp_.GetPieceSize(); ++id) {
      if (sp_.IsControl(id) || sp_.IsUnknown(id)) specials_.push_back({sp_.IdToPiece(id), id});
    }
    if (sp_.bos_id() >= 0) bos_ = sp_.bos_id();
    if (sp_.eos_id() >= 0) eos_ = sp_.eos_id();
    policy_.add_bos = bos_.has_value();  // as Llama's and Mistral's tokenizers
    description_ = fmt::format("SentencePiece model ({} pieces)", sp_.GetPieceSize());
  }

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int> ids;
    const auto status = sp_.Encode(absl::string_view(text.data(), text.size()), &ids);
    if (!status.ok()) ZD_THROW("sentencepiece Encode failed: {}", status.ToString());
    return {ids.begin(), ids.end()};
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::vector<int> in;
    in.reserve(ids.size());
    for (int32_t id : ids) {
      if (id >= 0 && id < sp_.GetPieceSize()) in.push_back(id);
    }
    std::string out;
    const auto status = sp_.Decode(in, &out);
    if (!status.ok()) ZD_THROW("sentencepiece Decode failed: {}", status.ToString());
    return out;
  }

  int32_t vocab_size() const override { return sp_.GetPieceSize(); }
  std::optional<int32_t> token_to_id(std::string_view token) const override {
    const int id = sp_.PieceToId(absl::string_view(token.data(), token.size()));
    if (id == sp_.unk_id() && token != sp_.IdToPiece(id)) return std::nullopt;
    return id;
  }
  std::optional<std::string> id_to_token(int32_t id) const override {
    if (id < 0 || id >= sp_.GetPieceSize()) return std::nullopt;
    return sp_.IdToPiece(id);
  }
  std::string describe() const override { return description_; }

 private:
  sentencepiece::SentencePieceProcessor sp_;
  std::string description_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece(const std::filesystem::path& file) {
  return std::make_unique<SentencePieceTokenizer>(file);
}

bool have_sentencepiece_support() { return true; }

#elif defined(ZEROD_SENTENCEPIECE_CLASH)

// The zerod binary: libsentencepiece's bundled protobuf cannot share a process with gRPC's.
std::unique_ptr<Tokenizer> load_sentencepiece(const std::filesystem::path& file) {
  ZD_THROW_INPUT("{}: the zerod command cannot load SentencePiece .model files (libsentencepiece "
                 "carries its own protobuf, which clashes with gRPC's in one process); give the "
                 "model's tokenizer.json instead (transformers' save_pretrained writes one), or "
                 "token ids (--prompt-tokens); zerod-shards does read .model files",
                 file.string());
}

bool have_sentencepiece_support() { return false; }

#else

std::unique_ptr<Tokenizer> load_sentencepiece(const std::filesystem::path& file) {
  ZD_THROW_INPUT("{}: SentencePiece models need libsentencepiece, and this zerod was built "
                 "without it (install libsentencepiece-dev, tools/deps.sh does, and rebuild)",
                 file.string());
}

bool have_sentencepiece_support() { return false; }

#endif

}  // namespace zerod::tokenizer
