// engine/tokenizer: loading (kinds, refusals with the JSON path) and small exact cases built
// here. Parity with the Python libraries on real trained tokenizers is tests/tokenizer.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/tokenizer/hf_components.h"
#include "engine/tokenizer/regex.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/unicode_normalize.h"

namespace zerod::tokenizer {
namespace {

namespace fs = std::filesystem;

class TokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("zerod_tokenizer_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path write(const std::string& name, const std::string& content) {
    const fs::path p = dir_ / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << content;
    return p;
  }

  // The message of the InputError load_tokenizer throws.
  std::string refusal(const fs::path& p) {
    try {
      load_tokenizer(p);
    } catch (const InputError& e) {
      return e.what();
    }
    ADD_FAILURE() << "no InputError for " << p;
    return {};
  }

  fs::path dir_;
};

// A BPE tokenizer.json with no pre-tokenizer: the whole text is one word.
std::string tiny_json(const std::string& merges, const std::string& extra = "",
                      const std::string& model_extra = "") {
  return R"({"version": "1.0", "added_tokens": [)" + extra + R"(],
    "normalizer": null, "pre_tokenizer": null, "post_processor": null, "decoder": null,
    "model": {"type": "BPE", "unk_token": "<unk>", )" + model_extra + R"(
      "vocab": {"<unk>": 0, "a": 1, "b": 2, "c": 3, "ab": 4, "abc": 5, "aa": 6, "aaaa": 7},
      "merges": )" + merges + "}}";
}

std::vector<int32_t> ids(std::initializer_list<int32_t> l) { return l; }

TEST_F(TokenizerTest, TinyBpeMergesByRankInBothMergeForms) {
  for (const std::string merges :
       {R"(["a b", "ab c", "a a", "aa aa"])", R"([["a", "b"], ["ab", "c"], ["a", "a"], ["aa", "aa"]])"}) {
    const auto tok = load_tokenizer(write("tokenizer.json", tiny_json(merges)));
    EXPECT_EQ(tok->encode("abcab"), ids({5, 4}));
    EXPECT_EQ(tok->encode("aaaaa"), ids({7, 1}));  // leftmost first among equal ranks
    EXPECT_EQ(tok->encode("abxb"), ids({4, 0, 2}));  // x is unknown
    EXPECT_EQ(tok->encode(""), ids({}));
    EXPECT_EQ(tok->vocab_size(), 8);
    EXPECT_EQ(tok->token_to_id("abc"), 5);
    EXPECT_EQ(tok->id_to_token(4), "ab");
    EXPECT_EQ(tok->decode(ids({5, 4})), "abc ab");  // no decoder: tokens joined by spaces
  }
}

TEST_F(TokenizerTest, FuseUnkAndByteFallback) {
  const auto fused = load_tokenizer(write("a/tokenizer.json", tiny_json(R"(["a b"])", "", R"("fuse_unk": true,)")));
  EXPECT_EQ(fused->encode("axyb"), ids({1, 0, 2}));
  const auto unfused = load_tokenizer(write("b/tokenizer.json", tiny_json(R"(["a b"])")));
  EXPECT_EQ(unfused->encode("axyb"), ids({1, 0, 0, 2}));

  const std::string json = R"({"added_tokens": [], "normalizer": null, "pre_tokenizer": null,
    "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]},
    "model": {"type": "BPE", "byte_fallback": true, "unk_token": "<unk>",
      "vocab": {"<unk>": 0, "<0x78>": 1, "<0xC3>": 2, "<0xA9>": 3, "a": 4}, "merges": []}})";
  const auto tok = load_tokenizer(write("c/tokenizer.json", json));
  EXPECT_EQ(tok->encode("axé"), ids({4, 1, 2, 3}));
  EXPECT_EQ(tok->encode("y"), ids({0}));  // no <0x79>: unk
  EXPECT_EQ(tok->decode(ids({4, 1, 2, 3})), "axé");
  EXPECT_EQ(tok->decode(ids({4, 2})), "a\uFFFD");  // an invalid byte run: U+FFFD per byte
}

TEST_F(TokenizerTest, AddedTokensAreMatchedBeforeTheModelAndTemplateAddsBos) {
  const std::string added =
      R"({"id": 8, "content": "<s>", "special": true, "normalized": false, "lstrip": false, "rstrip": false, "single_word": false},
         {"id": 9, "content": "<m>", "special": true, "normalized": false, "lstrip": true, "rstrip": true, "single_word": false})";
  std::string json = tiny_json(R"(["a b"])", added);
  json.replace(json.find(R"("post_processor": null)"), 22,
               R"("post_processor": {"type": "TemplateProcessing",
                   "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                   "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [8], "tokens": ["<s>"]}}})");
  const auto tok = load_tokenizer(write("tokenizer.json", json));
  EXPECT_EQ(tok->encode("ab<s>ab"), ids({4, 8, 4}));
  EXPECT_EQ(tok->encode("ab  <m>  ab"), ids({4, 9, 4}));  // lstrip/rstrip take the spaces
  EXPECT_EQ(tok->bos_id(), 8);
  EXPECT_TRUE(tok->policy().add_bos);
  EXPECT_FALSE(tok->policy().add_eos);
  EXPECT_EQ(tok->encode_with_specials("ab"), ids({8, 4}));
  EXPECT_EQ(tok->special_id("<m>"), 9);
  EXPECT_TRUE(tok->is_special(8));
  EXPECT_THROW(tok->set_policy({true, true}), InputError);  // no EOS in this vocabulary
}

TEST_F(TokenizerTest, SentencePieceStyleNormalizerAndDecoder) {
  const std::string json = R"({"added_tokens": [],
    "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                   {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
    "pre_tokenizer": null,
    "decoder": {"type": "Sequence", "decoders": [
      {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
      {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    "model": {"type": "BPE", "byte_fallback": true,
      "vocab": {"▁": 0, "a": 1, "b": 2, "▁a": 3, "▁ab": 4},
      "merges": [["▁", "a"], ["▁a", "b"]]}})";
  const auto tok = load_tokenizer(write("tokenizer.json", json));
  EXPECT_EQ(tok->encode("ab ab a"), ids({4, 4, 3}));
  EXPECT_EQ(tok->decode(ids({4, 4, 3})), "ab ab a");
  EXPECT_EQ(tok->encode(""), ids({}));  // Prepend leaves an empty text empty
}

TEST_F(TokenizerTest, ByteLevelWithGpt2PatternAndGpt2Files) {
  if (!have_regex_support()) GTEST_SKIP() << "built without PCRE2";
  const std::string vocab = R"({"h": 0, "i": 1, "\u0120": 2, "hi": 3, "\u0120hi": 4, "!": 5,
                                "<|endoftext|>": 6, "\u010a": 7})";
  const std::string json = R"({"added_tokens": [{"id": 6, "content": "<|endoftext|>",
      "special": true, "normalized": false, "lstrip": false, "rstrip": false, "single_word": false}],
    "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "vocab": )" + vocab + R"(, "merges": ["h i", "\u0120 hi"]}})";
  const auto tok = load_tokenizer(write("json/tokenizer.json", json));
  const auto expect = ids({3, 4, 5, 6, 7, 3});
  EXPECT_EQ(tok->encode("hi hi!<|endoftext|>\nhi"), expect);
  EXPECT_EQ(tok->decode(expect), "hi hi!<|endoftext|>\nhi");
  EXPECT_EQ(tok->encode("hi!"), ids({3, 5}));  // the pattern splits "hi" from "!"

  write("files/vocab.json", vocab);
  write("files/merges.txt", "#version: 0.2\nh i\n\u0120 hi\n");
  for (const fs::path& p : {dir_ / "files", dir_ / "files" / "vocab.json", dir_ / "files" / "merges.txt"}) {
    const auto files = load_tokenizer(p);
    EXPECT_EQ(files->encode("hi hi!<|endoftext|>\nhi"), expect) << p;
    EXPECT_EQ(files->eos_id(), 6);
  }
}

// load_tokenizer_in: a model directory's own tokenizer, or none (no error) where there is none.
TEST_F(TokenizerTest, LoadTokenizerInFindsADirectorysTokenizerOrNone) {
  if (!have_regex_support()) GTEST_SKIP() << "built without PCRE2";
  write("m/vocab.json", R"({"h": 0, "i": 1, "hi": 2})");
  write("m/merges.txt", "#version: 0.2\nh i\n");
  const auto tok = load_tokenizer_in(dir_ / "m");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->encode("hi"), ids({2}));
  write("w/model.safetensors", "x");
  EXPECT_EQ(load_tokenizer_in(dir_ / "w"), nullptr);                 // a directory without one
  EXPECT_EQ(load_tokenizer_in(dir_ / "nope"), nullptr);              // no such directory
  EXPECT_EQ(load_tokenizer_in(dir_ / "m" / "vocab.json"), nullptr);  // not a directory
  write("v/vocab.json", R"({"a": 0})");                              // half a GPT-2 pair
  EXPECT_EQ(load_tokenizer_in(dir_ / "v"), nullptr);
  write("s/tokenizer.model", "not a model");  // counted only where libsentencepiece is built in
  if (have_sentencepiece_support()) {
    EXPECT_NE(refusal(dir_ / "s").find("not a SentencePiece model"), std::string::npos);
    EXPECT_THROW(load_tokenizer_in(dir_ / "s"), InputError);
  } else {
    EXPECT_EQ(load_tokenizer_in(dir_ / "s"), nullptr);
  }
}

TEST_F(TokenizerTest, RefusesUnsupportedKinds) {
  const std::string bin = refusal(write("weights.bin", std::string("\x01\x02\x03", 3)));
  EXPECT_NE(bin.find("weights.bin: a file of unknown kind"), std::string::npos) << bin;
  EXPECT_NE(bin.find("supported: a Hugging Face tokenizer.json"), std::string::npos) << bin;
  EXPECT_NE(refusal(write("cl100k.tiktoken", "abc 0\n")).find("a tiktoken BPE file"),
            std::string::npos);
  EXPECT_NE(refusal(dir_ / "missing").find("no such file or directory"), std::string::npos);

  write("empty/readme.md", "hello");
  const std::string empty = refusal(dir_ / "empty");
  EXPECT_NE(empty.find("found: readme.md"), std::string::npos) << empty;

  const std::string unigram = refusal(write(
      "u/tokenizer.json", R"({"model": {"type": "Unigram", "vocab": [["a", 0.0]]}})"));
  EXPECT_NE(unigram.find("/model/type: the model \"Unigram\" is not supported"), std::string::npos)
      << unigram;
  const std::string lower = refusal(write(
      "n/tokenizer.json",
      R"({"normalizer": {"type": "Lowercase"}, "model": {"type": "BPE", "vocab": {}, "merges": []}})"));
  EXPECT_NE(lower.find("/normalizer/type: the normalizer \"Lowercase\" is not supported "
                       "(supported: Sequence, Replace, Prepend, NFC, NFD, NFKC, NFKD)"),
            std::string::npos)
      << lower;
}

// The four forms on utf8proc, each against its definition: composed and decomposed accents,
// Hangul syllables, compatibility characters; invalid bytes stay where they were.
TEST(UnicodeNormalize, TheFourFormsAndInvalidBytes) {
  if (!unicode_normalization_built()) GTEST_SKIP() << "built without utf8proc";
  const std::string e_acute = "\u00e9", e_comb = "e\u0301";           // é, e + combining acute
  const std::string han = "\ud55c", han_jamo = "\u1112\u1161\u11ab";  // 한, its jamo
  const std::string fi = "\ufb01", one = "\u2460";                    // ﬁ, ①
  EXPECT_EQ(unicode_normalize(e_comb + han_jamo, UnicodeForm::kNfc), e_acute + han);
  EXPECT_EQ(unicode_normalize(e_acute + han, UnicodeForm::kNfd), e_comb + han_jamo);
  // Compatibility characters change only under the K forms.
  EXPECT_EQ(unicode_normalize(fi + one, UnicodeForm::kNfc), fi + one);
  EXPECT_EQ(unicode_normalize(fi + one + e_comb, UnicodeForm::kNfkc), "fi1" + e_acute);
  EXPECT_EQ(unicode_normalize(fi + e_acute, UnicodeForm::kNfkd), "fi" + e_comb);
  // Canonical reordering of combining marks (dot below, class 220, before acute, 230).
  EXPECT_EQ(unicode_normalize("a\u0301\u0323", UnicodeForm::kNfd), "a\u0323\u0301");
  // An invalid byte splits the text into runs normalized apart and stays as it is.
  const std::string bad = "e\xff\u0301" + e_comb;
  EXPECT_EQ(unicode_normalize(bad, UnicodeForm::kNfc), "e\xff\u0301" + e_acute);
  EXPECT_EQ(unicode_normalize("", UnicodeForm::kNfc), "");
}

// A tokenizer.json with an NFC normalizer (Qwen2's) encodes the decomposed text as the composed.
TEST_F(TokenizerTest, NfcNormalizerComposesBeforeTheModel) {
  if (!unicode_normalization_built()) GTEST_SKIP() << "built without utf8proc";
  const std::string json = R"({"version": "1.0", "added_tokens": [],
    "normalizer": {"type": "NFC"}, "pre_tokenizer": null, "post_processor": null, "decoder": null,
    "model": {"type": "BPE", "unk_token": "<unk>",
      "vocab": {"<unk>": 0, "e": 1, "\u00e9": 2, "\u0301": 3}, "merges": []}})";
  const auto tok = load_tokenizer(write("nfc/tokenizer.json", json));
  EXPECT_EQ(tok->encode("e\u0301"), ids({2}));
  EXPECT_EQ(tok->encode("\u00e9e"), ids({2, 1}));
}

TEST_F(TokenizerTest, MissingMergesFileIsRefused) {
  write("g/vocab.json", R"({"a": 0})");
  const std::string by_file = refusal(dir_ / "g" / "vocab.json");
  EXPECT_NE(by_file.find("needs merges.txt beside it"), std::string::npos) << by_file;
  const std::string by_dir = refusal(dir_ / "g");
  EXPECT_NE(by_dir.find("has vocab.json but no merges.txt"), std::string::npos) << by_dir;
}

TEST_F(TokenizerTest, CorruptTokenizerJsonNamesTheJsonPath) {
  const std::string syntax = refusal(write("a/tokenizer.json", R"({"model": {"vocab": )"));
  EXPECT_NE(syntax.find("not valid JSON"), std::string::npos) << syntax;
  const std::string vocab = refusal(write("b/tokenizer.json", R"({"model": {"type": "BPE", "vocab": [1, 2]}})"));
  EXPECT_NE(vocab.find("/model/vocab: expected an object, found array"), std::string::npos) << vocab;
  const std::string id = refusal(write("c/tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": "x"}}})"));
  EXPECT_NE(id.find("/model/vocab/a: expected an integer, found string"), std::string::npos) << id;
  const std::string merge = refusal(write(
      "d/tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b", 7]}})"));
  EXPECT_NE(merge.find("/model/merges/1: expected a merge"), std::string::npos) << merge;
  const std::string oov = refusal(write(
      "e/tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b"]}})"));
  EXPECT_NE(oov.find("the merged token \"ab\" is not in the vocabulary"), std::string::npos) << oov;
  const std::string missing = refusal(write("f/tokenizer.json", R"({"added_tokens": []})"));
  EXPECT_NE(missing.find(": /: missing key \"model\""), std::string::npos) << missing;
  const std::string added = refusal(write(
      "g/tokenizer.json", R"({"added_tokens": [{"content": "<s>"}], "model": {"type": "BPE", "vocab": {}, "merges": []}})"));
  EXPECT_NE(added.find("/added_tokens/0: missing key \"id\""), std::string::npos) << added;
}

TEST_F(TokenizerTest, OptionalLibrariesMissingOrBadModelFilesAreRefused) {
  const std::string model = refusal(write("bad.model", "not a protobuf"));
  if (have_sentencepiece_support()) {
    EXPECT_NE(model.find("bad.model: not a SentencePiece model"), std::string::npos) << model;
  } else {
    EXPECT_NE(model.find("built without it (install libsentencepiece-dev"), std::string::npos)
        << model;
  }
  if (!have_regex_support()) {
    const std::string json = refusal(write("tokenizer.json", R"({"pre_tokenizer": {"type":
        "ByteLevel"}, "model": {"type": "BPE", "vocab": {}, "merges": []}})"));
    EXPECT_NE(json.find("need PCRE2"), std::string::npos) << json;
  }
}

TEST(TokenizerHelpers, PatternRewriteAndLossyUtf8) {
  EXPECT_EQ(translate_pattern(R"(a\sb)"),
            R"(a[\t\n\x0B\f\r\x20\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}]b)");
  EXPECT_EQ(translate_pattern(R"([^\s\p{L}])").find(R"([^\t\n)"), 0u);
  EXPECT_EQ(translate_pattern(R"(\\s)"), R"(\\s)");  // an escaped backslash, then "s"
  EXPECT_EQ(utf8_lossy("a\xe2\x82" "b\xff"), "a\uFFFDb\uFFFD");
  EXPECT_EQ(utf8_lossy("\xf0\x9f\x98\x80"), "\xf0\x9f\x98\x80");
}

}  // namespace
}  // namespace zerod::tokenizer
