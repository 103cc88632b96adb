// zerod-shards' inputs and manifest end to end: gzip and zstd inputs (several members/frames)
// give the shards the plain file gives; corrupt, truncated and mislabelled compressed files stop
// the run with exit code 2 naming the file and write nothing; PREFIX_manifest.json records the
// tokenizer's hash, the inputs, the documents and every shard's tokens, documents and hash, and
// agrees with the shards on disk.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/e2e_shards/shards_fixture.h"

#ifdef ZEROD_HAVE_ZLIB
#include <zlib.h>
#endif
#ifdef ZEROD_HAVE_ZSTD
#include <zstd.h>
#endif

namespace zerod {
namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A JSONL corpus of n records, each with a distinct text.
std::string corpus(int n) {
  std::string jsonl;
  for (int i = 0; i < n; ++i)
    jsonl += R"({"text": "hello world )" + std::to_string(i) + R"(, or hell é"})" + "\n";
  return jsonl;
}

#ifdef ZEROD_HAVE_ZLIB
// `text` as gzip, in two members (as `cat a.gz b.gz` makes).
std::string gzip_two_members(const std::string& text) {
  std::string out;
  for (const std::string& part : {text.substr(0, text.size() / 2), text.substr(text.size() / 2)}) {
    z_stream z{};
    EXPECT_EQ(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
    std::string buf(deflateBound(&z, part.size()) + 64, '\0');
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(part.data()));
    z.avail_in = static_cast<uInt>(part.size());
    z.next_out = reinterpret_cast<Bytef*>(buf.data());
    z.avail_out = static_cast<uInt>(buf.size());
    EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
    buf.resize(z.total_out);
    deflateEnd(&z);
    out += buf;
  }
  return out;
}
#endif

#ifdef ZEROD_HAVE_ZSTD
// `text` as zstd, in three frames with checksums.
std::string zstd_three_frames(const std::string& text) {
  std::string out;
  const size_t third = text.size() / 3;
  for (const std::string& part :
       {text.substr(0, third), text.substr(third, third), text.substr(2 * third)}) {
    std::string buf(ZSTD_compressBound(part.size()), '\0');
    ZSTD_CCtx* ctx = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(ctx, ZSTD_c_checksumFlag, 1);  // so corruption is always detected
    const size_t n = ZSTD_compress2(ctx, buf.data(), buf.size(), part.data(), part.size());
    ZSTD_freeCCtx(ctx);
    EXPECT_FALSE(ZSTD_isError(n));
    buf.resize(n);
    out += buf;
  }
  return out;
}
#endif

TEST_F(ShardsTokenizer, CompressedInputsGiveThePlainFilesShards) {
#if !defined(ZEROD_HAVE_ZLIB) || !defined(ZEROD_HAVE_ZSTD)
  GTEST_SKIP() << "built without zlib or libzstd";
#else
  const std::string text = corpus(2000);
  write("c.jsonl", text);
  write("c.jsonl.gz", gzip_two_members(text));
  write("c.jsonl.zst", zstd_three_frames(text));
  write("renamed.bin", zstd_three_frames(text));  // told by its bytes, not its name
  const std::string flags =
      "--tokenizer tok --jsonl --append-eos --val-fraction 0.1 --shard-tokens 20000 --prefix c ";
  for (const char* input : {"c.jsonl", "c.jsonl.gz", "c.jsonl.zst", "renamed.bin"}) {
    const std::string out = std::string("out_") + input;
    const RunResult r = run_in(dir_, kShards, flags + "--out-dir " + out + " " + input);
    ASSERT_EQ(r.code, 0) << input << "\n" << r.output;
    EXPECT_NE(r.output.find("2000 document(s)"), std::string::npos) << r.output;
  }
  int compared = 0;
  for (const auto& e : fs::directory_iterator(dir_ / "out_c.jsonl")) {
    if (e.path().extension() != ".bin") continue;
    for (const char* other : {"out_c.jsonl.gz", "out_c.jsonl.zst", "out_renamed.bin"}) {
      EXPECT_EQ(read_file(e.path()), read_file(dir_ / other / e.path().filename()))
          << other << "/" << e.path().filename();
      ++compared;
    }
  }
  EXPECT_GE(compared, 3 * 3);  // at least two train shards and a val shard each
  const auto gz = nlohmann::json::parse(read_file(dir_ / "out_c.jsonl.gz" / "c_manifest.json"));
  EXPECT_EQ(gz["inputs"][0]["kind"], "gzip");
  EXPECT_EQ(gz["inputs"][0]["bytes"], text.size());
  const auto zst = nlohmann::json::parse(read_file(dir_ / "out_c.jsonl.zst" / "c_manifest.json"));
  EXPECT_EQ(zst["inputs"][0]["kind"], "zstd");
  EXPECT_EQ(zst["inputs"][0]["bytes"], text.size());
  EXPECT_EQ(zst["shards"], gz["shards"]);

  // The byte tokenizer reads them too.
  const RunResult b =
      run_in(dir_, kShards, "--val-fraction 0 --out-dir bytes --prefix b c.jsonl.zst");
  ASSERT_EQ(b.code, 0) << b.output;
  EXPECT_NE(b.output.find(std::to_string(text.size()) + " bytes"), std::string::npos) << b.output;
#endif
}

TEST_F(ShardsTokenizer, CorruptTruncatedOrMislabelledCompressedInputIsRefused) {
#if !defined(ZEROD_HAVE_ZLIB) || !defined(ZEROD_HAVE_ZSTD)
  GTEST_SKIP() << "built without zlib or libzstd";
#else
  const std::string text = corpus(3000);
  const std::string gz = gzip_two_members(text);
  const std::string zst = zstd_three_frames(text);
  write("cut.jsonl.gz", gz.substr(0, gz.size() - 100));
  write("cut.jsonl.zst", zst.substr(0, zst.size() - 100));
  std::string flipped = zst;
  flipped[flipped.size() / 2] = static_cast<char>(flipped[flipped.size() / 2] ^ 0x5a);
  flipped[flipped.size() / 2 + 1] = static_cast<char>(flipped[flipped.size() / 2 + 1] ^ 0xa5);
  write("bad.jsonl.zst", flipped);
  std::string gz_flipped = gz;
  for (size_t i = 40; i < 60; ++i) gz_flipped[i] = static_cast<char>(gz_flipped[i] ^ 0xff);
  write("bad.jsonl.gz", gz_flipped);
  write("plain.jsonl.gz", text);
  // --skip-bad-lines: garbage that corrupt data decodes to before the library notices is
  // skipped as bad JSONL, so what stops the run is the library's own error.
  struct Case {
    const char* file;
    const char* says;
  };
  for (const Case& c : {Case{"cut.jsonl.gz", "gzip"}, Case{"cut.jsonl.zst", "truncated zstd"},
                        Case{"bad.jsonl.zst", "zstd"}, Case{"bad.jsonl.gz", "gzip"},
                        Case{"plain.jsonl.gz", "does not start with the gzip magic"}}) {
    const RunResult r = run_in(dir_, kShards,
                               std::string("--tokenizer tok --jsonl --skip-bad-lines "
                                           "--out-dir out --prefix x ") +
                                   c.file);
    EXPECT_EQ(r.code, 2) << c.file << "\n" << r.output;
    EXPECT_NE(r.output.find(c.file), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(dir_ / "out" / "x_train_000000.bin")) << c.file;
    EXPECT_FALSE(fs::exists(dir_ / "out" / "x_manifest.json")) << c.file;
  }
#endif
}

TEST_F(ShardsTokenizer, ManifestAgreesWithTheShardsAndTheTokenizer) {
  // Documents of different lengths, so shard boundaries fall inside documents.
  std::string jsonl;
  int64_t documents = 0;
  for (int i = 0; i < 500; ++i, ++documents) {
    jsonl += R"({"text": ")" + std::string(static_cast<size_t>(1 + (i * 37) % 90), 'l') +
             " hello " + std::to_string(i) + "\"}\n";
  }
  write("a.jsonl", jsonl);
  write("b.jsonl", R"({"text": "or"})"
                   "\n"
                   R"({"text": "world"})"
                   "\n");
  documents += 2;
  const RunResult r =
      run_in(dir_, kShards,
             "--tokenizer tok/tokenizer.json --jsonl --append-eos --prefix m "
             "--val-fraction 0.2 --shard-tokens 5000 --out-dir data a.jsonl b.jsonl");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("manifest data/m_manifest.json"), std::string::npos) << r.output;
  const auto m = nlohmann::json::parse(read_file(dir_ / "data" / "m_manifest.json"));
  EXPECT_EQ(m["format"], "zerod-shards-manifest");
  EXPECT_EQ(m["tokenizer"]["vocab_size"], 262);
  EXPECT_EQ(m["tokenizer"]["eos_id"], 261);
  EXPECT_EQ(m["tokenizer"]["files"], nlohmann::json::array({"tokenizer.json"}));
  EXPECT_EQ(m["token_bytes"], 2);
  EXPECT_EQ(m["documents"], documents);
  ASSERT_EQ(m["inputs"].size(), 2u);
  EXPECT_EQ(m["inputs"][0]["path"], "a.jsonl");
  EXPECT_EQ(m["inputs"][0]["documents"], 500);
  EXPECT_EQ(m["inputs"][1]["documents"], 2);
  EXPECT_EQ(m["inputs"][1]["bytes"], fs::file_size(dir_ / "b.jsonl"));

  // Hashes: against sha256sum where the build has OpenSSL, else present as crc32c.
  const bool sha = m["tokenizer"].contains("sha256");
  auto sha256sum = [&](const fs::path& p) {
    const RunResult s = run_in(dir_, "/usr/bin/sha256sum", p.string());
    EXPECT_EQ(s.code, 0) << s.output;
    return s.output.substr(0, 64);
  };
  if (sha)
    EXPECT_EQ(m["tokenizer"]["sha256"], sha256sum(dir_ / "tok" / "tokenizer.json"));
  else
    EXPECT_TRUE(m["tokenizer"].contains("crc32c"));

  // Every shard on disk is listed with its token count and hash; the documents that begin in
  // each shard (counted from the EOS ids before it) add up to all documents.
  int64_t listed_tokens = 0, listed_docs = 0, bins = 0;
  for (const auto& e : fs::directory_iterator(dir_ / "data"))
    bins += e.path().extension() == ".bin";
  ASSERT_EQ(m["shards"].size(), static_cast<size_t>(bins));
  EXPECT_GE(bins, 3);
  bool previous_ended_document = true;  // the stream starts with a document
  for (const auto& s : m["shards"]) {
    const fs::path path = dir_ / "data" / s["file"].get<std::string>();
    TokenShard shard(path.string());
    EXPECT_EQ(s["tokens"], shard.num_tokens()) << path;
    int64_t starts = 0;
    for (int64_t i = 0; i < shard.num_tokens(); ++i) {
      if (previous_ended_document) ++starts;
      previous_ended_document = shard.token(i) == 261;
    }
    EXPECT_EQ(s["documents"], starts) << path;
    if (sha) EXPECT_EQ(s["sha256"], sha256sum(path)) << path;
    listed_tokens += s["tokens"].get<int64_t>();
    listed_docs += s["documents"].get<int64_t>();
  }
  EXPECT_EQ(listed_tokens, m["train_tokens"].get<int64_t>() + m["val_tokens"].get<int64_t>());
  EXPECT_EQ(listed_docs, documents);
}

}  // namespace
}  // namespace zerod
