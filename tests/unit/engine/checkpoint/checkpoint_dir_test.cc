// The checkpoint directory's trust boundary: `latest` is a file anyone may have written; it is
// followed only to a checkpoint of its own directory (a valid tag), else ignored and the newest
// complete checkpoint is used. Messages about bad tags quote a prefix and the length.
#include "engine/checkpoint/checkpoint_dir.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/crc32c.h"
#include "core/error.h"
#include "engine/checkpoint/hf_model.h"
#include "engine/checkpoint/manifest.h"

namespace zerod {
namespace {

namespace fs = std::filesystem;

class CheckpointDir : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("zerod_ckpt_dir_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  // A complete checkpoint (a manifest without rank files) of `tag` at `step` in `dir`.
  static void save(const fs::path& dir, const std::string& tag, int64_t step) {
    prepare_save(dir.string(), tag);
    Manifest m;
    m.tag = tag;
    m.compute_dtype = "fp32";
    m.progress.global_step = step;
    commit_save(dir.string(), m);
  }
  static void write_latest(const fs::path& dir, const std::string& text) {
    std::ofstream(dir / "latest", std::ios::trunc) << text;
  }

  fs::path root_;
};

TEST_F(CheckpointDir, LatestNamingACheckpointOutsideItsDirectoryIsIgnored) {
  const fs::path mine = root_ / "ckpt", other = root_ / "other";
  save(mine, "global_step2", 2);
  save(mine, "global_step3", 3);
  save(other, "global_step5", 5);  // newer, and complete: loading it would be silent
  for (const std::string& bad : std::vector<std::string>{
           "../other/global_step5", (other / "global_step5").string(),
           "global_step3/../../other/global_step5", "..", ".", "global_step3.tmp"}) {
    SCOPED_TRACE(bad);
    write_latest(mine, bad + "\n");
    EXPECT_FALSE(read_latest(mine.string()).has_value());
    const FoundCheckpoint f = find_checkpoint(mine.string(), "latest");
    EXPECT_EQ(f.tag, "global_step3");  // the newest complete one of this directory
    EXPECT_EQ(f.path, (mine / "global_step3").string());
    EXPECT_EQ(f.manifest.progress.global_step, 3);
  }
  // A valid `latest` is still followed, even to an older checkpoint.
  write_latest(mine, "global_step2\n");
  EXPECT_EQ(read_latest(mine.string()).value_or(""), "global_step2");
  EXPECT_EQ(find_checkpoint(mine.string(), "latest").tag, "global_step2");
  // Retention never keeps (or removes) anything outside the directory because of `latest`.
  write_latest(mine, "../other/global_step5\n");
  apply_retention(mine.string(), 1);
  EXPECT_TRUE(fs::exists(other / "global_step5" / "manifest.json"));
  EXPECT_TRUE(fs::exists(mine / "global_step3" / "manifest.json"));
  EXPECT_FALSE(fs::exists(mine / "global_step2"));
}

TEST_F(CheckpointDir, DeeplyNestedJsonFilesAreRefusedBeforeAnyTreeIsBuilt) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  fs::create_directories(root_ / "ckpt" / "global_step1");
  std::ofstream(root_ / "ckpt" / "global_step1" / "manifest.json") << deep;
  try {
    read_manifest((root_ / "ckpt" / "global_step1").string());
    FAIL() << "read";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("JSON nests 100000 levels deep"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(find_checkpoint((root_ / "ckpt").string(), "latest"), InputError);
  // A Hugging Face directory's shard index.
  fs::create_directories(root_ / "hf");
  std::ofstream(root_ / "hf" / "model.safetensors.index.json")
      << "{\"weight_map\": " << deep << "}";
  try {
    hf_weight_files((root_ / "hf").string());
    FAIL() << "read";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("levels deep"), std::string::npos) << e.what();
  }
}

TEST_F(CheckpointDir, ALongTagIsQuotedByAPrefixAndItsLength) {
  const std::string tag(10240, 'a');  // valid characters, too long
  try {
    validate_tag(tag);
    FAIL() << "accepted";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_LT(msg.size(), 400u) << msg.substr(0, 500);
    EXPECT_NE(msg.find("(10240 bytes)"), std::string::npos) << msg.substr(0, 500);
    EXPECT_NE(msg.find("1-128 characters"), std::string::npos) << msg.substr(0, 500);
  }
  const std::string bad = std::string(10240, 'b') + "/..";
  for (const std::string& which : {tag, bad}) {
    try {
      find_checkpoint(root_.string(), which);
      FAIL() << "found";
    } catch (const InputError& e) {
      EXPECT_LT(std::string(e.what()).size(), 400u) << std::string(e.what()).substr(0, 500);
    }
    try {
      find_checkpoint((root_ / "missing").string(), which);
      FAIL() << "found";
    } catch (const InputError& e) {
      EXPECT_LT(std::string(e.what()).size(), 400u) << std::string(e.what()).substr(0, 500);
    }
  }
}

// An unusable checkpoint_dir is found before training (issue: it failed at the first save).
TEST_F(CheckpointDir, TheProbeRefusesWhatCannotHoldCheckpointsAndLeavesNothingBehind) {
  auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  };
  // A writable place: created (job start) or only probed at its parent (zerod check).
  const fs::path fresh = root_ / "a" / "b";
  EXPECT_EQ(
      message([&] { probe_checkpoint_dir(fresh.string(), "train.checkpoint_dir", false, "t"); }),
      "");
  EXPECT_FALSE(fs::exists(root_ / "a"));
  EXPECT_EQ(
      message([&] { probe_checkpoint_dir(fresh.string(), "train.checkpoint_dir", true, "t"); }),
      "");
  EXPECT_TRUE(fs::is_directory(fresh));
  EXPECT_TRUE(fs::is_empty(fresh));  // the probe file is gone
  EXPECT_EQ(std::distance(fs::directory_iterator(root_ / "a"), fs::directory_iterator()), 1);
  // A file in the way.
  std::ofstream(root_ / "file") << "x";
  for (bool create : {false, true}) {
    EXPECT_NE(message([&] {
                probe_checkpoint_dir((root_ / "file").string(), "train.checkpoint_dir", create,
                                     "t");
              })
                  .find("train.checkpoint_dir: " + (root_ / "file").string() +
                        " exists and is not a directory"),
              std::string::npos);
    EXPECT_NE(message([&] {
                probe_checkpoint_dir((root_ / "file" / "sub").string(), "train.checkpoint_dir",
                                     create, "t");
              }).find("train.checkpoint_dir"),
              std::string::npos);
  }
  // A pseudo file system that takes no files (even for root).
  for (bool create : {false, true}) {
    const std::string msg = message(
        [&] { probe_checkpoint_dir("/proc/zerod-ckpt", "train.checkpoint_dir", create, "t"); });
    EXPECT_NE(msg.find("train.checkpoint_dir"), std::string::npos) << create;
    EXPECT_NE(msg.find("/proc/zerod-ckpt"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace zerod

namespace zerod {
namespace {

// The tokenizer side files and the blend weights survive manifest.json; a tokenizer file name
// that leaves tokenizer/ is refused; a damaged tokenizer file fails verification like a rank file.
TEST(CheckpointManifest, TokenizerFilesAndBlendRoundTripAndAreVerified) {
  Manifest m;
  m.tag = "t";
  m.compute_dtype = "fp32";
  m.progress.data_blend = {0.7, 0.3};
  m.tokenizer = CheckpointTokenizer{"tok/tokenizer.json",
                                    "tokenizer.json (BPE, byte-level)",
                                    {{"tokenizer/tokenizer.json", 3, 0}}};
  const std::string bytes = "abc";
  m.tokenizer->files[0].crc32c = crc32c(bytes.data(), bytes.size());
  const Manifest back = Manifest::from_json(m.to_json(), "manifest.json");
  ASSERT_TRUE(back.tokenizer.has_value());
  EXPECT_EQ(back.tokenizer->source, "tok/tokenizer.json");
  EXPECT_EQ(back.tokenizer->kind, "tokenizer.json (BPE, byte-level)");
  ASSERT_EQ(back.tokenizer->files.size(), 1u);
  EXPECT_EQ(back.tokenizer->files[0].name, "tokenizer/tokenizer.json");
  EXPECT_EQ(back.tokenizer->files[0].crc32c, m.tokenizer->files[0].crc32c);
  EXPECT_EQ(back.progress.data_blend, m.progress.data_blend);
  Manifest plain;
  plain.tag = "p";
  plain.compute_dtype = "fp32";
  const Manifest plain_back = Manifest::from_json(plain.to_json(), "manifest.json");
  EXPECT_FALSE(plain_back.tokenizer.has_value());
  EXPECT_TRUE(plain_back.progress.data_blend.empty());

  for (const char* name :
       {"../escape.json", "tokenizer/../../x", "tokenizer/", "rank_00000.x", "tokenizer/.hidden"}) {
    nlohmann::json j = m.to_json();
    j["tokenizer"]["files"][0]["name"] = name;
    EXPECT_THROW(Manifest::from_json(j, "manifest.json"), InputError) << name;
  }

  const fs::path dir = fs::temp_directory_path() / ("zerod_ckpt_tok_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "tokenizer");
  std::ofstream(dir / "tokenizer" / "tokenizer.json", std::ios::binary) << bytes;
  EXPECT_NO_THROW(verify_checkpoint(dir.string(), m));
  std::ofstream(dir / "tokenizer" / "tokenizer.json", std::ios::binary) << "abd";
  try {
    verify_checkpoint(dir.string(), m);
    ADD_FAILURE() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer/tokenizer.json"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("corrupt"), std::string::npos);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace zerod
