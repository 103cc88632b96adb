// Bad Llama-family jobs at the level a `zerod train JOB.json` run meets them: the job file (and an
// init_from directory's config.json) is refused with a ConfigError (exit 2) that names the keys
// to fix, before anything is trained; a checkpoint of another Llama shape is refused on resume.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "engine/config/config_error.h"
#include "engine/config/model_spec.h"
#include "engine/config/parse.h"
#include "train_test_util.h"

namespace zerod {
namespace {

namespace fs = std::filesystem;
using testing::TempCorpus;

class LlamaJob : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { corpus_ = new TempCorpus("zerod_llama_job"); }
  static void TearDownTestSuite() {
    delete corpus_;
    corpus_ = nullptr;
  }
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("zerod_llama_job_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A job file around `model` (the model object's JSON), over the test corpus.
  std::string write_job(const std::string& model, const std::string& train_extra = "") const {
    const std::string text = R"({
      "train_batch_size": 4,
      "optimizer": {"type": "AdamW", "params": {"lr": 2e-3}},
      "model": )" + model + R"(,
      "data": {"train": ")" + corpus_->train_glob() +
                             R"("},
      "train": {"steps": 2, "seed": 4, "peak_flops": 1e11)" +
                             train_extra + R"(}
    })";
    const fs::path path = dir_ / "job.json";
    std::ofstream(path) << text;
    return path.string();
  }

  // What `zerod train JOB.json` does before training: load, resolve, check, build the trainer.
  static void train_job_file(const std::string& path) {
    ParsedJob job = load_job_file(path);
    resolve_job(job.config, 1);
    check_supported(job.config);
    Trainer t(job.config, testing::quiet_trainer());
    t.run();
  }

  // The ConfigError `f` throws; fails the test when it throws nothing or something else.
  template <class F>
  static std::vector<std::string> config_problems(F&& f) {
    try {
      f();
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.exit_code(), 2);
      return e.problems();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a ConfigError: " << e.what();
      return {};
    }
    ADD_FAILURE() << "no error";
    return {};
  }

  static TempCorpus* corpus_;
  fs::path dir_;
};

TempCorpus* LlamaJob::corpus_ = nullptr;

constexpr const char* kHeads4Kv3 = R"({"type": "llama", "hidden_size": 32,
    "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 3, "vocab_size": 123, "seq_len": 16})";

// Sanity of the fixture: the same job with 2 key/value heads trains.
TEST_F(LlamaJob, AValidJobFileTrains) {
  std::string good = kHeads4Kv3;
  good.replace(good.find("\"num_key_value_heads\": 3"), 24, "\"num_key_value_heads\": 2");
  EXPECT_NO_THROW(train_job_file(write_job(good)));
}

TEST_F(LlamaJob, HeadsNotDivisibleByKeyValueHeadsIsAConfigErrorNamingBothKeys) {
  const std::string path = write_job(kHeads4Kv3);
  try {
    train_job_file(path);
    FAIL() << "a job with 4 attention heads on 3 key/value heads trained";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.exit_code(), 2);
    ASSERT_EQ(e.problems().size(), 1u) << e.what();
    const std::string& p = e.problems()[0];
    EXPECT_EQ(p.rfind("model.num_attention_heads: 4", 0), 0u) << p;
    EXPECT_NE(p.find("model.num_key_value_heads 3"), std::string::npos) << p;
    // what() names the job file.
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST_F(LlamaJob, HeadsFromAnInitFromConfigJsonAreCheckedToo) {
  // A Hugging Face directory whose config.json has 4 heads on 3 key/value heads.
  const fs::path hf = dir_ / "hf";
  fs::create_directories(hf);
  std::ofstream(hf / "config.json") << R"({"model_type": "llama", "hidden_size": 32,
      "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 3, "vocab_size": 123, "hidden_act": "silu"})";
  const std::vector<std::string> from_file = config_problems([&] {
    train_job_file(write_job(R"({"init_from": ")" + hf.string() + R"(", "seq_len": 16})"));
  });
  ASSERT_EQ(from_file.size(), 1u);
  EXPECT_NE(from_file[0].find("num_attention_heads"), std::string::npos) << from_file[0];
  EXPECT_NE(from_file[0].find("num_key_value_heads 3"), std::string::npos) << from_file[0];
  // The job's key overrides a good config.json (2 key/value heads) into a bad shape.
  std::ofstream(hf / "config.json") << R"({"model_type": "llama", "hidden_size": 32,
      "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "vocab_size": 123})";
  const std::vector<std::string> overridden = config_problems([&] {
    train_job_file(write_job(R"({"init_from": ")" + hf.string() +
                             R"(", "num_key_value_heads": 3, "seq_len": 16})"));
  });
  ASSERT_EQ(overridden.size(), 1u);
  EXPECT_NE(overridden[0].find("model.num_attention_heads"), std::string::npos) << overridden[0];
  EXPECT_NE(overridden[0].find("model.num_key_value_heads 3"), std::string::npos) << overridden[0];
}

// The tiny models the parametrized trainer tests run over (train_test_util.h) are the shapes
// those tests claim to cover: GQA, tied and untied heads, a padded vocabulary, a window that masks.
TEST_F(LlamaJob, TheTinyTestModelsAreTheShapesTheTestsClaim) {
  auto spec = [](const testing::TinyModel& m) {
    return model_spec(testing::tiny_job(*corpus_, 1, 0, 1, 1, "", "", 8, "", m).model);
  };
  const ModelSpec gpt2 = spec(testing::tiny_gpt2());
  EXPECT_EQ(gpt2.arch, ModelArch::kGpt2);
  for (const auto& m :
       {testing::tiny_llama(), testing::tiny_llama_tied(), testing::tiny_mistral()}) {
    SCOPED_TRACE(m.name);
    const ModelSpec s = spec(m);
    EXPECT_TRUE(s.llama_family());
    EXPECT_EQ(s.n_head, 4);
    EXPECT_EQ(s.kv_heads(), 2);
    EXPECT_EQ(s.ffn(), 48);
    EXPECT_EQ(s.vocab_size, 123);
    EXPECT_EQ(s.vp(), 128);
    EXPECT_LE(s.seq_len, 16);
  }
  EXPECT_EQ(spec(testing::tiny_llama()).arch, ModelArch::kLlama);
  EXPECT_FALSE(spec(testing::tiny_llama()).tied());
  EXPECT_TRUE(spec(testing::tiny_llama_tied()).tied());
  const ModelSpec mistral = spec(testing::tiny_mistral());
  EXPECT_EQ(mistral.arch, ModelArch::kMistral);
  EXPECT_GT(mistral.sliding_window, 0);
  EXPECT_LT(mistral.sliding_window, mistral.seq_len);
}

// A Trainer given a JobConfig that skipped validation still refuses the shape, naming both keys
// (the model's own check), instead of training something malformed.
TEST_F(LlamaJob, TrainerRefusesAnUnvalidatedConfigWithBadHeads) {
  std::string good = kHeads4Kv3;
  good.replace(good.find("\"num_key_value_heads\": 3"), 24, "\"num_key_value_heads\": 2");
  ParsedJob job = load_job_file(write_job(good));
  resolve_job(job.config, 1);
  job.config.model.n_kv_head = 3;
  try {
    Trainer t(job.config, testing::quiet_trainer());
    FAIL() << "the trainer built a model with 4 heads on 3 key/value heads";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("num_attention_heads"), std::string::npos) << what;
    EXPECT_NE(what.find("num_key_value_heads"), std::string::npos) << what;
  }
}

// A checkpoint of a Llama with other key/value heads does not load into this job's model.
TEST_F(LlamaJob, ResumingACheckpointOfAnotherKeyValueHeadCountIsAnInputError) {
  const std::string ckpt = (dir_ / "ckpt").string();
  const std::string train_extra = R"(, "checkpoint_dir": ")" + ckpt + R"(", "save_interval": 2)";
  std::string kv2 = kHeads4Kv3;
  kv2.replace(kv2.find("\"num_key_value_heads\": 3"), 24, "\"num_key_value_heads\": 2");
  train_job_file(write_job(kv2, train_extra));
  ASSERT_TRUE(fs::exists(fs::path(ckpt) / "global_step2" / "manifest.json"));
  std::string kv1 = kHeads4Kv3;
  kv1.replace(kv1.find("\"num_key_value_heads\": 3"), 24, "\"num_key_value_heads\": 1");
  ParsedJob job = load_job_file(write_job(kv1, train_extra));
  resolve_job(job.config, 1);
  try {
    Trainer t(job.config, testing::quiet_trainer());
    t.resume("global_step2");
    FAIL() << "a checkpoint of 2 key/value heads loaded into a model of 1";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("global_step2"), std::string::npos) << e.what();
    // The message names the setting, not only a unit size.
    EXPECT_NE(std::string(e.what()).find(
                  "saved for a model with num_key_value_heads 2; this job's model has "
                  "num_key_value_heads 1"),
              std::string::npos)
        << e.what();
  }
  // Another architecture of the same shapes (Mistral: Llama with a sliding window) is refused.
  std::string mistral = kv2;
  mistral.replace(mistral.find("\"llama\""), 7, "\"mistral\"");
  ParsedJob other = load_job_file(write_job(mistral, train_extra));
  resolve_job(other.config, 1);
  try {
    Trainer t(other.config, testing::quiet_trainer());
    t.resume("global_step2");
    FAIL() << "a llama checkpoint loaded into a mistral model";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("type llama; this job's model has type mistral"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace zerod
