// Mixture of experts in the model section: Mixtral's config.json keys (model.type "mixtral"), the
// moe section on GPT-2 and the Llama family, the typed ModelSpec they give, the round trip
// through job_to_json, and the refusals (each naming its JSON path and value).
#include <gtest/gtest.h>

#include "config_test_util.h"
#include "engine/config/model_spec.h"

namespace zerod {
namespace {

using nlohmann::json;
using testing_config::contains;
using testing_config::job_with;
using testing_config::joined;
using testing_config::parse;
using testing_config::problems_of;

// Mixtral-8x7B-v0.1's config.json as published (transformers 4.36 spelling).
json mixtral_8x7b_config() {
  return json::parse(R"({
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
    "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
    "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": false,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
    "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.36.0.dev0", "use_cache": true, "vocab_size": 32000})");
}

json tiny_mixtral() {
  return {{"type", "mixtral"},
          {"hidden_size", 64},
          {"intermediate_size", 96},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"vocab_size", 256},
          {"num_local_experts", 4},
          {"num_experts_per_tok", 2},
          {"output_router_logits", true},
          {"seq_len", 32}};
}

json tiny_gpt2_moe(json moe) {
  return {{"type", "gpt2"},    {"n_layer", 4},  {"n_head", 2},          {"n_embd", 32},
          {"vocab_size", 256}, {"seq_len", 32}, {"moe", std::move(moe)}};
}

TEST(MoeSection, APastedMixtralConfigJsonIsAModelSection) {
  json model = mixtral_8x7b_config();
  model["type"] = "mixtral";
  model["seq_len"] = 4096;
  const ParsedJob job = parse(job_with({{"model", model}}));
  const ModelConfig& m = job.config.model;
  EXPECT_EQ(m.type, "mixtral");
  EXPECT_EQ(m.moe.num_experts, 8);
  EXPECT_EQ(m.moe.top_k, 2);
  EXPECT_EQ(m.moe.aux_loss_coef, 0.02);
  EXPECT_FALSE(m.moe.output_router_logits);
  const ModelSpec s = model_spec(m);
  EXPECT_EQ(s.arch, ModelArch::kMixtral);
  EXPECT_EQ(s.moe.num_experts, 8);
  EXPECT_EQ(s.moe.top_k, 2);
  EXPECT_TRUE(s.moe.renormalize);
  EXPECT_FALSE(s.moe.drop_tokens);
  EXPECT_EQ(s.moe.aux_loss, MoeAuxLoss::kHuggingFace);
  EXPECT_EQ(s.moe.aux_loss_coef, 0.0);  // output_router_logits false: reported, not trained
  EXPECT_EQ(s.moe.moe_layers(s.n_layer), 32);
  EXPECT_EQ(parse(job_to_json(job.config).dump()).config, job.config);

  model["output_router_logits"] = true;
  EXPECT_EQ(model_spec(parse(job_with({{"model", model}})).config.model).moe.aux_loss_coef, 0.02);
}

TEST(MoeSection, MixtralDefaultsAreMixtralConfigs) {
  json model = tiny_mixtral();
  model.erase("num_local_experts");
  model.erase("num_experts_per_tok");
  model.erase("output_router_logits");
  const ModelConfig m = parse(job_with({{"model", model}})).config.model;
  EXPECT_EQ(m.moe.num_experts, 8);
  EXPECT_EQ(m.moe.top_k, 2);
  EXPECT_EQ(m.moe.aux_loss_coef, 0.001);
  EXPECT_FALSE(m.moe.output_router_logits);
  EXPECT_EQ(m.rms_norm_eps, 1e-5);
  EXPECT_EQ(m.rope_theta, 1e6);
}

TEST(MoeSection, AMoeSectionOnGpt2AndLlamaGivesDeepSpeedGating) {
  const json moe = {{"num_experts", 4},         {"top_k", 2},
                    {"capacity_factor", 1.25},  {"eval_capacity_factor", 2.0},
                    {"min_capacity", 2},        {"drop_tokens", true},
                    {"aux_loss_coef", 0.05},    {"router_z_loss_coef", 0.001},
                    {"moe_layer_frequency", 2}, {"shared_experts", 1}};
  const ParsedJob job = parse(job_with({{"model", tiny_gpt2_moe(moe)}}));
  const ModelSpec s = model_spec(job.config.model);
  EXPECT_EQ(s.arch, ModelArch::kGpt2);
  EXPECT_EQ(s.moe.num_experts, 4);
  EXPECT_EQ(s.moe.top_k, 2);
  EXPECT_EQ(s.moe.capacity_factor, 1.25);
  EXPECT_EQ(s.moe.eval_capacity_factor, 2.0);
  EXPECT_EQ(s.moe.min_capacity, 2);
  EXPECT_TRUE(s.moe.drop_tokens);
  EXPECT_TRUE(s.moe.renormalize);
  EXPECT_EQ(s.moe.drop_policy, MoeDropPolicy::kChoiceRank);
  EXPECT_EQ(s.moe.aux_loss, MoeAuxLoss::kDeepSpeed);
  EXPECT_EQ(s.moe.aux_loss_coef, 0.05);
  EXPECT_EQ(s.moe.z_loss_coef, 0.001);
  EXPECT_EQ(s.moe.shared_experts, 1);
  EXPECT_EQ(s.moe.moe_layers(4), 2);  // blocks 0 and 2
  EXPECT_TRUE(s.moe.is_moe_layer(2));
  EXPECT_FALSE(s.moe.is_moe_layer(1));
  EXPECT_EQ(parse(job_to_json(job.config).dump()).config, job.config);

  // DeepSpeed's defaults: top-1 (not renormalised), capacity 1.0, min_capacity 4, dropping.
  const ModelSpec d =
      model_spec(parse(job_with({{"model", tiny_gpt2_moe({{"num_experts", 2}})}})).config.model);
  EXPECT_EQ(d.moe.top_k, 1);
  EXPECT_FALSE(d.moe.renormalize);
  EXPECT_TRUE(d.moe.drop_tokens);
  EXPECT_EQ(d.moe.capacity_factor, 1.0);
  EXPECT_EQ(d.moe.min_capacity, 4);
  EXPECT_EQ(d.moe.aux_loss_coef, 0.01);

  json llama = tiny_mixtral();
  llama["type"] = "llama";
  for (const char* k : {"num_local_experts", "num_experts_per_tok", "output_router_logits"})
    llama.erase(k);
  llama["moe"] = {{"num_experts", 3}, {"top_k", 3}, {"drop_tokens", false}};
  const ModelSpec l = model_spec(parse(job_with({{"model", llama}})).config.model);
  EXPECT_EQ(l.arch, ModelArch::kLlama);
  EXPECT_EQ(l.moe.num_experts, 3);
  EXPECT_EQ(l.moe.drop_policy, MoeDropPolicy::kProbs);
  EXPECT_FALSE(l.moe.drop_tokens);
}

TEST(MoeSection, BadInputIsNamedWithItsPathAndValue) {
  auto gpt2 = [](json moe) {
    return joined(problems_of(job_with({{"model", tiny_gpt2_moe(moe)}})));
  };
  EXPECT_NE(gpt2({{"num_experts", 2}, {"top_k", 3}})
                .find("model.moe.top_k: 3 is more than the 2 experts (model.moe.num_experts)"),
            std::string::npos);
  EXPECT_NE(
      gpt2({{"num_experts", 2}, {"capacity_factor", 0.0}}).find("model.moe.capacity_factor: 0"),
      std::string::npos);
  EXPECT_NE(gpt2({{"num_experts", 2}, {"eval_capacity_factor", -1.0}})
                .find("model.moe.eval_capacity_factor: -1"),
            std::string::npos);
  EXPECT_NE(gpt2({{"num_experts", 0}}).find("model.moe.num_experts: 0"), std::string::npos);
  EXPECT_NE(gpt2({{"top_k", 1}}).find("model.moe.num_experts: required in a moe section"),
            std::string::npos);
  EXPECT_NE(gpt2({{"num_experts", 2}, {"experts", 2}}).find("model.moe.experts: unknown key"),
            std::string::npos);
  EXPECT_NE(gpt2({{"num_experts", 2}, {"moe_layer_frequency", 5}})
                .find("model.moe.moe_layer_frequency: 5 is more than the 4 layers (model.n_layer)"),
            std::string::npos);

  json mixtral = tiny_mixtral();
  auto with = [&](const char* k, json v) {
    json x = mixtral;
    x[k] = std::move(v);
    return joined(problems_of(job_with({{"model", x}})));
  };
  EXPECT_NE(with("num_experts_per_tok", 5)
                .find("model.num_experts_per_tok: 5 is more than the 4 experts "
                      "(model.num_local_experts)"),
            std::string::npos);
  EXPECT_NE(with("sliding_window", 4096)
                .find("model.sliding_window: 4096 is not supported for type \"mixtral\""),
            std::string::npos);
  EXPECT_NE(
      with("router_jitter_noise", 0.1).find("model.router_jitter_noise: 0.1 is not supported"),
      std::string::npos);
  EXPECT_NE(with("moe", json{{"num_experts", 2}})
                .find("model.moe: a moe section cannot be combined with type \"mixtral\""),
            std::string::npos);
  EXPECT_NE(with("num_experts", 2).find("model.num_experts: unknown key"), std::string::npos);
  EXPECT_NE(with("mlp_bias", true).find("model.mlp_bias: unknown key"), std::string::npos);
  json llama = {{"type", "llama"},
                {"hidden_size", 64},
                {"intermediate_size", 96},
                {"num_hidden_layers", 2},
                {"num_attention_heads", 4},
                {"mlp_bias", true},
                {"moe", {{"num_experts", 2}}}};
  EXPECT_NE(joined(problems_of(job_with({{"model", llama}})))
                .find("model.mlp_bias: true is not supported with experts"),
            std::string::npos);
}

TEST(MoeSection, WhatMoeLayersDoNotRunWithIsRefusedAtCheck) {
  const json model = tiny_mixtral();
  auto problems = [&](json extra) {
    json j = json::parse(job_with({{"model", model}}));
    for (auto& [k, v] : extra.items()) j[k] = v;
    return joined(problems_of(j.dump()));
  };
  EXPECT_NE(problems({{"parallelism", {{"expert", 3}}}})
                .find("parallelism.expert: 3 does not divide the 4 experts "
                      "(model.num_local_experts)"),
            std::string::npos);
  json zero3 = json::parse(job_with({}))["zero_optimization"];
  zero3["stage"] = 3;
  // Every ZeRO stage combines with expert parallelism.
  EXPECT_EQ(problems({{"parallelism", {{"expert", 2}}}, {"zero_optimization", zero3}})
                .find("zero_optimization"),
            std::string::npos);
  // Tensor parallelism splits the experts (with sequence parallelism too); context parallelism
  // sums the router's statistics (Mixtral is dropless), also with expert groups.
  EXPECT_EQ(problems({{"parallelism", {{"tensor", 2}}}}).find("parallelism"), std::string::npos);
  EXPECT_EQ(
      problems({{"parallelism", {{"tensor", 2}, {"sequence_parallel", true}}}}).find("parallelism"),
      std::string::npos);
  EXPECT_EQ(problems({{"parallelism", {{"context", 2}}}}).find("parallelism"), std::string::npos);
  EXPECT_EQ(
      problems({{"parallelism", {{"context", 2}, {"expert", 2}}}}).find("parallelism.context"),
      std::string::npos);
  // Pipeline stages run their MoE blocks (also with expert parallelism), not with Mixtral's
  // all-layer load-balancing loss (output_router_logits).
  json accum = 4;
  json quiet = json::parse(job_with({{"model", model}}));
  quiet["model"]["output_router_logits"] = false;
  quiet["parallelism"] = {{"pipeline", 2}};
  quiet["gradient_accumulation_steps"] = accum;
  const std::string staged = joined(problems_of(quiet.dump()));
  EXPECT_EQ(staged.find("pipeline"), std::string::npos) << staged;

  json logits = json::parse(job_with({{"model", model}}));
  logits["model"]["output_router_logits"] = true;
  logits["parallelism"] = {{"pipeline", 2}};
  logits["gradient_accumulation_steps"] = 4;
  const std::string with_loss =
      joined(problems_of(logits.dump()));  // (accepted: it crosses stages)
  EXPECT_EQ(with_loss.find("pipeline"), std::string::npos) << with_loss;
  json train = json::parse(job_with({}))["train"];
  train["device"] = "cuda";
  EXPECT_NE(problems({{"train", train}})
                .find("train.device: \"cuda\" cannot run type \"mixtral\": the CUDA backend has "
                      "no mixture-of-experts kernels yet"),
            std::string::npos);
  // A dense model with parallelism.expert 2 is refused too.
  EXPECT_TRUE(contains(problems_of(job_with({{"parallelism", {{"expert", 2}}}})),
                       "parallelism.expert: 2: expert parallelism needs a model with experts"));
}

}  // namespace
}  // namespace zerod
