// Strictness: unknown keys with suggestions, wrong types, values out of range, integral floats,
// malformed JSON, missing files, duplicate keys, and all problems of a file reported at once.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "config_test_util.h"

namespace zerod {
namespace {

using nlohmann::json;
using testing_config::contains;
using testing_config::job_with;
using testing_config::joined;
using testing_config::parse;
using testing_config::problems_of;

struct ProblemCase {
  const char* name;
  json patch;
  const char* problem;  // the exact, single problem expected
};

class SingleProblem : public ::testing::TestWithParam<ProblemCase> {};

TEST_P(SingleProblem, IsReportedExactly) {
  const ProblemCase& c = GetParam();
  const auto problems = problems_of(job_with(c.patch));
  EXPECT_EQ(problems, std::vector<std::string>{c.problem}) << joined(problems);
}

INSTANTIATE_TEST_SUITE_P(
    Table, SingleProblem,
    ::testing::Values(
        // Unknown keys at several depths, with and without a close known key.
        ProblemCase{"unknown_nested",
                    {{"zero_optimization", {{"stagee", 2}}}},
                    "zero_optimization.stagee: unknown key; did you mean 'stage'?"},
        ProblemCase{"unknown_top",
                    {{"optimiser", {{"type", "Adam"}}}},
                    "optimiser: unknown key; did you mean 'optimizer'?"},
        ProblemCase{"unknown_top_far", {{"xyzzy", 1}}, "xyzzy: unknown key"},
        ProblemCase{"unknown_depth3",
                    {{"zero_optimization", {{"offload_optimizer", {{"devise", "cpu"}}}}}},
                    "zero_optimization.offload_optimizer.devise: unknown key; did you mean "
                    "'device'?"},
        ProblemCase{"unknown_params",
                    {{"optimizer", {{"type", "Adam"}, {"params", {{"weight_dacay", 0.1}}}}}},
                    "optimizer.params.weight_dacay: unknown key; did you mean 'weight_decay'? "
                    "(valid for Adam: lr, betas, eps, weight_decay, bias_correction, adam_w_mode, "
                    "torch_adam, amsgrad)"},
        ProblemCase{"unknown_model",
                    {{"model", {{"n_embed", 768}}}},
                    "model.n_embed: unknown key; did you mean 'n_embd'?"},
        ProblemCase{"unknown_scheduler_param",
                    {{"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_steps", 10}}}}}},
                    "scheduler.params.warmup_steps: unknown key; did you mean "
                    "'warmup_num_steps'?"},
        // Wrong types.
        ProblemCase{"bool_as_string",
                    {{"fp16", {{"enabled", "yes"}}}},
                    "fp16.enabled: expected a boolean, got \"yes\""},
        ProblemCase{"int_as_string",
                    {{"train", {{"steps", "10"}}}},
                    "train.steps: expected an integer, got \"10\""},
        ProblemCase{"number_as_bool",
                    {{"gradient_clipping", true}},
                    "gradient_clipping: expected a number, got true"},
        ProblemCase{"object_as_array",
                    {{"zero_optimization", {{"offload_param", {1, 2}}}}},
                    "zero_optimization.offload_param: expected an object, got [1,2]"},
        ProblemCase{"auto_placeholder",
                    {{"gradient_accumulation_steps", "auto"}},
                    "gradient_accumulation_steps: expected an integer, got \"auto\" (\"auto\" is "
                    "a placeholder the Hugging Face Trainer fills in; zerod needs the value)"},
        // Out of range.
        ProblemCase{"stage_4",
                    {{"zero_optimization", {{"stage", 4}}}},
                    "zero_optimization.stage: 4 is out of range (allowed: 0, 1, 2, 3)"},
        ProblemCase{"negative_clip",
                    {{"gradient_clipping", -1.0}},
                    "gradient_clipping: -1.0 is out of range (allowed: >= 0)"},
        ProblemCase{"zero_predivide",
                    {{"gradient_predivide_factor", 0}},
                    "gradient_predivide_factor: 0 is out of range (allowed: > 0)"},
        ProblemCase{"zero_collective_timeout",
                    {{"train", {{"steps", 1}, {"collective_timeout", 0}}}},
                    "train.collective_timeout: 0 is out of range (allowed: > 0)"},
        ProblemCase{"window_zero",
                    {{"fp16", {{"loss_scale_window", 0}}}},
                    "fp16.loss_scale_window: 0 is out of range (allowed: >= 1)"},
        ProblemCase{"ratio_above_one",
                    {{"zero_optimization", {{"offload_optimizer", {{"ratio", 1.5}}}}}},
                    "zero_optimization.offload_optimizer.ratio: 1.5 is out of range (allowed: "
                    "[0, 1])"},
        // Integral floats: 5.5 is not an integer; 1e30 does not fit.
        ProblemCase{"fraction_for_int",
                    {{"train", {{"steps", 5.5}}}},
                    "train.steps: expected an integer, got 5.5"},
        ProblemCase{"huge_float_for_int",
                    {{"zero_optimization", {{"reduce_bucket_size", 1e30}}}},
                    "zero_optimization.reduce_bucket_size: 1e+30 is out of range (allowed: >= "
                    "0)"},
        ProblemCase{"int_field_overflow",
                    {{"model", {{"n_layer", 3000000000LL}}}},
                    "model.n_layer: 3000000000 is out of range (allowed: 1 to 2147483647)"}),
    [](const ::testing::TestParamInfo<ProblemCase>& info) { return info.param.name; });

TEST(ConfigProblems, IntegralFloatsAreIntegers) {
  const ParsedJob job = parse(job_with({{"zero_optimization",
                                         {{"reduce_bucket_size", 5e8},
                                          {"allgather_bucket_size", 2.0e8},
                                          {"stage3_max_live_parameters", 1e9}}},
                                        {"train", {{"steps", 1e3}}}}));
  EXPECT_EQ(job.config.zero.reduce_bucket_size, 500000000);
  EXPECT_EQ(job.config.zero.allgather_bucket_size, 200000000);
  EXPECT_EQ(job.config.zero.stage3_max_live_parameters, 1000000000);
  EXPECT_EQ(job.config.train.steps, 1000);
}

TEST(ConfigProblems, AllProblemsOfAFileAreReported) {
  const auto problems = problems_of(job_with({{"zero_optimization", {{"stage", 7}, {"stagee", 1}}},
                                              {"fp16", {{"enabled", 1}}},
                                              {"train", {{"steps", -1}}},
                                              {"model", {{"n_head", 0}}}}));
  EXPECT_EQ(problems.size(), 5u) << joined(problems);
  EXPECT_TRUE(contains(problems, "zero_optimization.stage: 7 is out of range"));
  EXPECT_TRUE(contains(problems, "zero_optimization.stagee: unknown key"));
  EXPECT_TRUE(contains(problems, "fp16.enabled: expected a boolean, got 1"));
  EXPECT_TRUE(contains(problems, "train.steps: -1 is out of range"));
  EXPECT_TRUE(contains(problems, "model.n_head: 0 is out of range"));

  // what() is one line per problem, each naming the file.
  try {
    parse_job_text(job_with({{"fp16", {{"enabled", 1}}}, {"train", {{"steps", -1}}}}), "j.json");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "j.json: fp16.enabled: expected a boolean, got 1\n"
              "j.json: train.steps: -1 is out of range (allowed: >= 1)");
    EXPECT_EQ(e.exit_code(), 2);
  }
}

TEST(ConfigProblems, MalformedJsonNamesLineAndColumn) {
  const std::string text = "{\n  \"train\": {\"steps\": 10},\n  \"fp16\": {\"enabled\": tru}\n}\n";
  try {
    parse_job_text(text, "bad.json");
    FAIL() << "parsed malformed JSON";
  } catch (const ConfigError& e) {
    ASSERT_EQ(e.problems().size(), 1u);
    const std::string& p = e.problems()[0];
    EXPECT_EQ(p.rfind("invalid JSON: ", 0), 0u) << p;
    EXPECT_NE(p.find("line 3, column"), std::string::npos) << p;
    EXPECT_NE(std::string(e.what()).find("bad.json: "), std::string::npos);
  }
  EXPECT_TRUE(contains(problems_of("{\"train\": {\"steps\": 1},}"), "invalid JSON"));
  EXPECT_TRUE(contains(problems_of(""), "invalid JSON"));
  EXPECT_TRUE(
      contains(problems_of("[1, 2]"), "expected a JSON object at the top level, got [1,2]"));
}

TEST(ConfigProblems, DuplicateKeysAreRejected) {
  const auto p =
      problems_of(R"({"train_micro_batch_size_per_gpu": 1, "train": {"steps": 1, "steps": 2}})");
  EXPECT_EQ(p.size(), 1u) << joined(p);
  EXPECT_TRUE(contains(p, "train.steps: duplicate key"));
}

TEST(ConfigProblems, MissingFileIsAnInputErrorNamingIt) {
  const std::string path = ::testing::TempDir() + "/zerod_no_such_job.json";
  std::remove(path.c_str());
  try {
    load_job_file(path);
    FAIL() << "loaded a missing file";
  } catch (const ConfigError&) {
    FAIL() << "a missing file is not a config problem";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_EQ(e.exit_code(), 2);
  }
  EXPECT_THROW(load_job_file(::testing::TempDir()), InputError);  // a directory
}

TEST(ConfigProblems, LoadsAFileAndNamesItInProblems) {
  const std::string path = ::testing::TempDir() + "/zerod_job_test.json";
  {
    std::ofstream out(path);
    out << "// job\n{\"train_micro_batch_size_per_gpu\": 3, \"train\": {\"steps\": 4}}\n";
  }
  const ParsedJob job = load_job_file(path);
  EXPECT_EQ(job.config.micro_batch(), 3);
  EXPECT_EQ(job.config.source, path);
  {
    std::ofstream out(path);
    out << "{\"train\": {\"steps\": 0}, \"train_micro_batch_size_per_gpu\": 1}";
  }
  try {
    load_job_file(path);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), path + ": train.steps: 0 is out of range (allowed: >= 1)");
  }
  std::remove(path.c_str());
}

TEST(ConfigProblems, DeprecatedKeysMapWithAWarning) {
  struct Case {
    const char* name;
    json patch;
    const char* warning;
    bool (*check)(const JobConfig&);
  };
  const Case cases[] = {
      {"cpu_offload",
       {{"zero_optimization", {{"stage", 2}, {"cpu_offload", true}}}},
       "zero_optimization.cpu_offload: deprecated",
       [](const JobConfig& c) { return c.zero.offload_optimizer.device == OffloadDevice::kCpu; }},
      {"cpu_offload_param",
       {{"zero_optimization", {{"stage", 3}, {"cpu_offload_param", true}}}},
       "zero_optimization.cpu_offload_param: deprecated",
       [](const JobConfig& c) { return c.zero.offload_param.device == OffloadDevice::kCpu; }},
      {"cpu_offload_params",
       {{"zero_optimization", {{"stage", 3}, {"cpu_offload_params", true}}}},
       "zero_optimization.cpu_offload_params: deprecated",
       [](const JobConfig& c) { return c.zero.offload_param.device == OffloadDevice::kCpu; }},
      {"cpu_offload_use_pin_memory",
       {{"zero_optimization",
         {{"stage", 2}, {"cpu_offload", true}, {"cpu_offload_use_pin_memory", true}}}},
       "zero_optimization.cpu_offload_use_pin_memory: deprecated",
       [](const JobConfig& c) {
         return c.zero.offload_optimizer.pin_memory && c.zero.offload_param.pin_memory;
       }},
      {"gather_fp16",
       {{"zero_optimization", {{"stage", 3}, {"stage3_gather_fp16_weights_on_model_save", true}}}},
       "zero_optimization.stage3_gather_fp16_weights_on_model_save: deprecated",
       [](const JobConfig& c) { return c.zero.stage3_gather_16bit_weights_on_model_save; }},
      {"thread_count",
       {{"aio", {{"thread_count", 4}}}},
       "aio.thread_count: deprecated",
       [](const JobConfig& c) { return c.aio.intra_op_parallelism == 4; }},
      {"bfloat16",
       {{"bfloat16", {{"enabled", true}}}},
       "bfloat16: deprecated",
       [](const JobConfig& c) { return c.bf16.enabled; }},
      {"zero_bool",
       {{"zero_optimization", true}, {"allgather_size", 1e6}},
       "zero_optimization: the boolean form is deprecated",
       [](const JobConfig& c) {
         return c.zero.stage == 1 && c.zero.allgather_bucket_size == 1000000;
       }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ParsedJob job;
    ASSERT_NO_THROW(job = parse(job_with(c.patch))) << joined(problems_of(job_with(c.patch)));
    EXPECT_TRUE(contains(job.warnings, c.warning)) << joined(job.warnings);
    EXPECT_TRUE(c.check(job.config));
  }
}

TEST(ConfigProblems, DeprecatedKeyConflictingWithItsNewFormIsAnError) {
  EXPECT_TRUE(contains(
      problems_of(job_with({{"zero_optimization",
                             {{"stage", 2},
                              {"cpu_offload", true},
                              {"offload_optimizer", {{"device", "nvme"}, {"nvme_path", "/n"}}}}}})),
      "zero_optimization.cpu_offload: true conflicts with offload_optimizer.device \"nvme\""));
  EXPECT_TRUE(
      contains(problems_of(job_with({{"aio", {{"thread_count", 2}, {"intra_op_parallelism", 4}}}})),
               "aio.thread_count: 2 conflicts with intra_op_parallelism 4"));
  EXPECT_TRUE(contains(
      problems_of(job_with({{"bf16", {{"enabled", true}}}, {"bfloat16", {{"enabled", false}}}})),
      "bfloat16: conflicts with \"bf16\""));
  EXPECT_TRUE(
      contains(problems_of(job_with({{"zero_optimization",
                                      {{"stage3_gather_fp16_weights_on_model_save", true},
                                       {"stage3_gather_16bit_weights_on_model_save", false}}}})),
               "stage3_gather_fp16_weights_on_model_save: true conflicts"));
  EXPECT_TRUE(contains(problems_of(job_with({{"zero_optimization",
                                              {{"stage", 3},
                                               {"cpu_offload_use_pin_memory", true},
                                               {"offload_param", {{"pin_memory", false}}}}}})),
                       "cpu_offload_use_pin_memory: true conflicts"));
  // Consistent old and new forms are accepted (with the warning).
  const ParsedJob same = parse(job_with(
      {{"zero_optimization",
        {{"stage", 2}, {"cpu_offload", true}, {"offload_optimizer", {{"device", "cpu"}}}}}}));
  EXPECT_EQ(same.config.zero.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_TRUE(contains(problems_of(job_with({{"allgather_size", 5}})),
                       "allgather_size: only used with the deprecated boolean"));
}

}  // namespace
}  // namespace zerod
