// The model section for the Llama family: Hugging Face config.json keys, a directory's
// config.json under init_from, the round trip through job_to_json, and the refusals.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "config_test_util.h"
#include "engine/config/json_reader.h"
#include "engine/config/model_spec.h"

namespace zerod {
namespace {

using nlohmann::json;
using testing_config::contains;
using testing_config::job_with;
using testing_config::joined;
using testing_config::parse;
using testing_config::problems_of;

// Meta-Llama-3-8B's config.json as published (transformers 4.40 spelling).
json llama3_8b_config() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 8192,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null,
    "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.40.0.dev0", "use_cache": true, "vocab_size": 128256})");
}

TEST(ModelSection, APastedLlamaConfigJsonIsAModelSection) {
  json model = llama3_8b_config();
  model["type"] = "llama";
  model["seq_len"] = 2048;
  const ParsedJob job = parse(job_with({{"model", model}}));
  const ModelConfig& m = job.config.model;
  EXPECT_EQ(m.type, "llama");
  EXPECT_EQ(m.n_embd, 4096);
  EXPECT_EQ(m.n_layer, 32);
  EXPECT_EQ(m.n_head, 32);
  EXPECT_EQ(m.n_kv_head, 8);
  EXPECT_EQ(m.intermediate_size, 14336);
  EXPECT_EQ(m.vocab_size, 128256);
  EXPECT_EQ(m.rms_norm_eps, 1e-5);
  EXPECT_EQ(m.rope_theta, 500000.0);
  EXPECT_FALSE(m.tie_word_embeddings);
  EXPECT_EQ(m.seq_len, 2048);
  const ModelSpec s = model_spec(m);
  EXPECT_EQ(s.arch, ModelArch::kLlama);
  EXPECT_EQ(s.head_size(), 128);
  // The resolved job reads back to the same config.
  EXPECT_EQ(parse(job_to_json(job.config).dump()).config, job.config);
}

TEST(ModelSection, RopeScalingAndRopeParametersSpellingsAgree) {
  json a = {{"type", "llama"},
            {"hidden_size", 64},
            {"intermediate_size", 96},
            {"num_hidden_layers", 2},
            {"num_attention_heads", 4},
            {"rope_theta", 500000.0},
            {"rope_scaling",
             {{"rope_type", "llama3"},
              {"factor", 8.0},
              {"low_freq_factor", 1.0},
              {"high_freq_factor", 4.0},
              {"original_max_position_embeddings", 8192}}}};
  json b = a;
  b.erase("rope_scaling");
  b.erase("rope_theta");
  b["rope_parameters"] = {{"rope_type", "llama3"},   {"rope_theta", 500000.0},
                          {"factor", 8.0},           {"low_freq_factor", 1.0},
                          {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  const ModelConfig ma = parse(job_with({{"model", a}})).config.model;
  const ModelConfig mb = parse(job_with({{"model", b}})).config.model;
  EXPECT_EQ(ma, mb);
  EXPECT_EQ(ma.rope_type, "llama3");
  EXPECT_EQ(model_spec(ma).rope_scaling.type, RopeScaling::Type::kLlama3);
  // The older "type" key of rope_scaling too.
  json c = a;
  c["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  EXPECT_EQ(parse(job_with({{"model", c}})).config.model.rope_type, "linear");
}

// Qwen2.5's published yarn block (with a max_position_embeddings) and dynamic NTK: read, kept
// through job_to_json, and the keys they need or zerod does not build refused by path.
TEST(ModelSection, YarnAndDynamicRopeKeepTheirKeysAndMaxPositions) {
  json y = {{"type", "qwen2"},
            {"hidden_size", 64},
            {"intermediate_size", 96},
            {"num_hidden_layers", 2},
            {"num_attention_heads", 4},
            {"num_key_value_heads", 2},
            {"max_position_embeddings", 32768},
            {"rope_scaling",
             {{"type", "yarn"},
              {"factor", 4},
              {"original_max_position_embeddings", 32768},
              {"attention_factor", nullptr},
              {"beta_fast", 16},
              {"beta_slow", nullptr}}}};
  json job = testing_config::minimal_job();
  job["model"] = y;  // (not through job_with: a merge patch drops nulls)
  const ParsedJob py = parse(job.dump());
  const ModelConfig& m = py.config.model;
  EXPECT_EQ(m.rope_type, "yarn");
  EXPECT_EQ(m.rope_factor, 4.0);
  EXPECT_EQ(m.rope_original_max_position_embeddings, 32768);
  EXPECT_EQ(m.max_position_embeddings, 32768);
  EXPECT_EQ(m.rope_attention_factor, 0.0);  // null: derived from the factor
  EXPECT_EQ(m.rope_beta_fast, 16.0);
  EXPECT_EQ(m.rope_beta_slow, 1.0);  // null: the default
  EXPECT_EQ(parse(job_to_json(py.config).dump()).config, py.config);
  const ModelSpec s = model_spec(m);
  EXPECT_EQ(s.rope_scaling.type, RopeScaling::Type::kYarn);
  EXPECT_EQ(s.rope_scaling.max_position_embeddings, 32768);
  EXPECT_EQ(s.rope_scaling.beta_fast, 16.0);

  json d = y;
  d["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  const ModelConfig md = parse(job_with({{"model", d}})).config.model;
  EXPECT_EQ(md.rope_type, "dynamic");
  EXPECT_EQ(md.max_position_embeddings, 32768);
  EXPECT_EQ(model_spec(md).rope_scaling.type, RopeScaling::Type::kDynamic);
  // Where the frequencies do not depend on it, max_position_embeddings is not kept.
  json l = y;
  l["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  EXPECT_EQ(parse(job_with({{"model", l}})).config.model.max_position_embeddings, 0);

  const auto problems = [&](const json& model) {
    return problems_of(job_with({{"model", model}}));
  };
  json no_len = d;
  no_len.erase("max_position_embeddings");
  EXPECT_TRUE(contains(problems(no_len),
                       "model.max_position_embeddings: required with rope_type "
                       "\"dynamic\""))
      << joined(problems(no_len));
  json yarn_len = y;
  yarn_len.erase("max_position_embeddings");  // original_max_position_embeddings is enough
  yarn_len["rope_scaling"].erase("attention_factor");
  yarn_len["rope_scaling"].erase("beta_slow");
  EXPECT_TRUE(problems(yarn_len).empty()) << joined(problems(yarn_len));
  json small = d;
  small["rope_scaling"]["factor"] = 0.5;
  EXPECT_TRUE(contains(problems(small), "model.rope_scaling.factor: 0.5 must be at least 1"))
      << joined(problems(small));
  json deepseek = d;
  deepseek["rope_scaling"]["mscale"] = 0.707;
  EXPECT_TRUE(contains(problems(deepseek), "model.rope_scaling.mscale: 0.707 is not supported"))
      << joined(problems(deepseek));
  json untruncated = d;
  untruncated["rope_scaling"]["truncate"] = false;
  EXPECT_TRUE(
      contains(problems(untruncated), "model.rope_scaling.truncate: false is not supported"))
      << joined(problems(untruncated));
  // Document masking with dynamic past max_position_embeddings: the frequencies would depend on
  // each batch's longest document.
  json masked = json::parse(job_with({{"model", d}}));
  masked["model"]["max_position_embeddings"] = 8;
  masked["model"]["seq_len"] = 16;
  masked["data"]["document_masking"] = true;
  masked["data"]["eos_token_id"] = 0;
  EXPECT_TRUE(contains(problems_of(masked.dump()),
                       "data.document_masking: true cannot be combined with rope_type "
                       "\"dynamic\" when model.seq_len 16 is above model.max_position_embeddings "
                       "8"))
      << joined(problems_of(masked.dump()));
  masked["model"]["seq_len"] = 8;
  EXPECT_FALSE(contains(problems_of(masked.dump()), "rope_type \"dynamic\""));
}

TEST(ModelSection, ArchitectureSpecificKeys) {
  json base = {{"hidden_size", 64},
               {"intermediate_size", 96},
               {"num_hidden_layers", 2},
               {"num_attention_heads", 4},
               {"num_key_value_heads", 2}};
  json mistral = base;
  mistral["type"] = "mistral";
  EXPECT_EQ(parse(job_with({{"model", mistral}})).config.model.sliding_window, 4096);  // default
  mistral["sliding_window"] = nullptr;  // (not through job_with: a merge patch drops nulls)
  json job = testing_config::minimal_job();
  job["model"] = mistral;
  EXPECT_EQ(parse(job.dump()).config.model.sliding_window, 0);
  mistral.erase("sliding_window");
  json qwen = base;
  qwen["type"] = "qwen2";
  qwen["sliding_window"] = 4096;  // unused without use_sliding_window
  qwen["use_sliding_window"] = false;
  const ModelConfig q = parse(job_with({{"model", qwen}})).config.model;
  EXPECT_EQ(model_spec(q).sliding_window, 0);
  EXPECT_EQ(model_spec(q).window_of(1), 0);
  EXPECT_TRUE(model_spec(q).qkv_bias);
  EXPECT_FALSE(model_spec(q).o_bias);
  json llama = base;
  llama["type"] = "llama";
  llama["attention_bias"] = true;
  const ModelSpec ls = model_spec(parse(job_with({{"model", llama}})).config.model);
  EXPECT_TRUE(ls.qkv_bias && ls.o_bias);
  // attention_bias is Llama's key, not Mistral's.
  mistral["attention_bias"] = true;
  EXPECT_TRUE(
      contains(problems_of(job_with({{"model", mistral}})), "model.attention_bias: unknown key"));
}

// Qwen2's per-layer window (transformers 4.57): with use_sliding_window, the layers from
// max_window_layers on, or those layer_types names ("layer_types" is in every config.json that
// transformers >= 4.53 writes, windowed or not).
TEST(ModelSection, Qwen2WindowsTheLayersOfMaxWindowLayersOrLayerTypes) {
  json qwen = {{"type", "qwen2"},
               {"hidden_size", 64},
               {"intermediate_size", 96},
               {"num_hidden_layers", 3},
               {"num_attention_heads", 4},
               {"num_key_value_heads", 2},
               {"use_sliding_window", true},
               {"sliding_window", 5},
               {"max_window_layers", 1}};
  const ParsedJob a = parse(job_with({{"model", qwen}}));
  const ModelSpec sa = model_spec(a.config.model);
  EXPECT_EQ(sa.window_of(0), 0);
  EXPECT_EQ(sa.window_of(1), 5);
  EXPECT_EQ(sa.window_of(2), 5);
  EXPECT_EQ(parse(job_to_json(a.config).dump()).config, a.config);
  // layer_types wins over max_window_layers.
  qwen["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention"};
  const ParsedJob b = parse(job_with({{"model", qwen}}));
  const ModelSpec sb = model_spec(b.config.model);
  EXPECT_EQ(sb.window_of(0), 5);
  EXPECT_EQ(sb.window_of(1), 0);
  EXPECT_EQ(sb.window_of(2), 5);
  EXPECT_EQ(parse(job_to_json(b.config).dump()).config, b.config);
  // Every layer windowed: one rule for all.
  qwen["layer_types"] = {"sliding_attention", "sliding_attention", "sliding_attention"};
  const ModelSpec sc = model_spec(parse(job_with({{"model", qwen}})).config.model);
  EXPECT_TRUE(sc.sliding_layers.empty());
  EXPECT_EQ(sc.window_of(1), 5);
  // Without use_sliding_window no layer is windowed, whatever layer_types says (as a
  // transformers 4.57 config.json of an unwindowed Qwen2 has it).
  qwen["use_sliding_window"] = false;
  qwen["layer_types"] = {"full_attention", "full_attention", "full_attention"};
  const ModelSpec sd = model_spec(parse(job_with({{"model", qwen}})).config.model);
  EXPECT_EQ(sd.sliding_window, 0);
  EXPECT_EQ(sd.window_of(2), 0);
  // Refused by path: a layer count that differs, a type zerod does not know.
  qwen["layer_types"] = {"full_attention", "full_attention"};
  EXPECT_TRUE(contains(problems_of(job_with({{"model", qwen}})),
                       "model.layer_types: 2 entries for model.num_hidden_layers 3"))
      << joined(problems_of(job_with({{"model", qwen}})));
  qwen["layer_types"] = {"full_attention", "chunked_attention", "full_attention"};
  EXPECT_TRUE(contains(problems_of(job_with({{"model", qwen}})),
                       "model.layer_types[1]: \"chunked_attention\" is not supported"))
      << joined(problems_of(job_with({{"model", qwen}})));
}

TEST(ModelSection, BadShapesAndUnsupportedFeaturesAreNamed) {
  json m = {{"type", "llama"},
            {"hidden_size", 64},
            {"intermediate_size", 96},
            {"num_hidden_layers", 2},
            {"num_attention_heads", 4}};
  auto with = [&](const char* k, json v) {
    json x = m;
    x[k] = std::move(v);
    return joined(problems_of(job_with({{"model", x}})));
  };
  EXPECT_NE(with("num_key_value_heads", 3)
                .find("model.num_attention_heads: 4 is not divisible by "
                      "model.num_key_value_heads 3"),
            std::string::npos);
  EXPECT_NE(with("hidden_size", 66)
                .find("model.hidden_size: 66 is not divisible by "
                      "model.num_attention_heads 4"),
            std::string::npos);
  EXPECT_NE(with("rope_scaling", {{"rope_type", "longrope"}, {"factor", 4.0}})
                .find("model.rope_scaling.rope_type: \"longrope\" is not supported (supported: "
                      "default, linear, llama3, dynamic, yarn)"),
            std::string::npos);
  EXPECT_NE(with("hidden_act", "gelu").find("model.hidden_act: \"gelu\" is not supported"),
            std::string::npos);
  EXPECT_NE(with("n_embd", 64).find("model.n_embd: unknown key"), std::string::npos);
  json no_ffn = m;
  no_ffn.erase("intermediate_size");
  EXPECT_TRUE(contains(problems_of(job_with({{"model", no_ffn}})),
                       "model.intermediate_size: required for type \"llama\""));
  EXPECT_TRUE(contains(
      problems_of(R"({"train_micro_batch_size_per_gpu": 1, "model": null, "train": {"steps": 1}})"),
      "model: null"));
}

class HfDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("zerod_model_section_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write_config(const json& j) { std::ofstream(dir_ / "config.json") << j.dump(2); }
  std::string dir() const { return dir_.string(); }
  std::filesystem::path dir_;
};

TEST_F(HfDir, InitFromADirectoryTakesItsConfigAndTheJobOverridesKeys) {
  json c = llama3_8b_config();
  c["num_hidden_layers"] = 2;
  write_config(c);
  const ParsedJob job =
      parse(job_with({{"model", {{"init_from", dir()}, {"seq_len", 64}, {"rope_theta", 1e4}}}}));
  const ModelConfig& m = job.config.model;
  EXPECT_EQ(m.type, "llama");  // from model_type
  EXPECT_EQ(m.n_layer, 2);
  EXPECT_EQ(m.n_kv_head, 8);
  EXPECT_EQ(m.vocab_size, 128256);
  EXPECT_EQ(m.rope_theta, 1e4);  // the job's value wins
  EXPECT_EQ(m.seq_len, 64);
  EXPECT_EQ(parse(job_to_json(job.config).dump()).config, job.config);
}

TEST_F(HfDir, ProblemsInTheDirectoryNameTheFile) {
  json c = llama3_8b_config();
  c["quantization_config"] = {{"bits", 4}};
  write_config(c);
  const std::string file = (dir_ / "config.json").string();
  EXPECT_TRUE(contains(problems_of(job_with({{"model", {{"init_from", dir()}}}})),
                       file + ".quantization_config: unknown key"));
  c = llama3_8b_config();
  c["model_type"] = "gemma2";
  write_config(c);
  EXPECT_TRUE(contains(problems_of(job_with({{"model", {{"init_from", dir()}}}})),
                       file + ": model_type: \"gemma2\" is not a supported architecture "
                              "(supported: gpt2, llama, mistral, qwen2, mixtral)"));
  std::filesystem::remove(dir_ / "config.json");
  EXPECT_TRUE(contains(problems_of(job_with({{"model", {{"init_from", dir()}}}})),
                       "model.init_from: " + dir() +
                           " is a directory without a config.json or weights "
                           "(model.safetensors, model.safetensors.index.json)"));
}

// zerod serve (set_quote_file_values(false)): the values of the directory's config.json are not
// quoted, its keys still named; the job file's own values are. zerod check quotes them all.
TEST_F(HfDir, TheDaemonDoesNotQuoteTheValuesOfTheDirectorysConfig) {
  json c = llama3_8b_config();
  c["hidden_act"] = "gelu-secret";
  c["rms_norm_eps"] = "secret-eps";
  write_config(c);
  const std::string file = (dir_ / "config.json").string();
  const std::string job = job_with({{"model", {{"init_from", dir()}, {"seq_len", "job-value"}}}});
  const std::string quoted = joined(problems_of(job));
  EXPECT_NE(quoted.find(file + ".hidden_act: \"gelu-secret\" is not supported"), std::string::npos)
      << quoted;
  config::set_quote_file_values(false);
  const std::string hidden = joined(problems_of(job));
  config::set_quote_file_values(true);
  EXPECT_NE(hidden.find(file + ".hidden_act: (value not shown) is not supported"),
            std::string::npos)
      << hidden;
  EXPECT_NE(hidden.find(file + ".rms_norm_eps: expected a number, got (value not shown)"),
            std::string::npos)
      << hidden;
  EXPECT_EQ(hidden.find("secret"), std::string::npos) << hidden;
  EXPECT_NE(hidden.find("model.seq_len: expected an integer, got \"job-value\""), std::string::npos)
      << hidden;
}

// A directory of weights without a config.json is read like the weights file: the job's model
// section gives the shape.
TEST_F(HfDir, AWeightsDirectoryWithoutConfigJsonTakesTheJobsShape) {
  std::ofstream(dir_ / "model.safetensors") << "weights";
  const JobConfig c =
      parse(job_with(
                {{"model", {{"init_from", dir()}, {"n_layer", 2}, {"n_embd", 32}, {"n_head", 2}}}}))
          .config;
  EXPECT_EQ(c.model.type, "gpt2");
  EXPECT_EQ(c.model.n_layer, 2);
  EXPECT_EQ(c.model.init_from, dir());
}

}  // namespace
}  // namespace zerod
