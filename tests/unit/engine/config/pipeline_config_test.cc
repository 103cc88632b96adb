// The pipeline keys of the parallelism section: pipeline, pipeline_schedule, virtual_stages and
// pipeline_partition (a method or a list of layer counts); the data-parallel size and rank layout
// with the pipeline outermost; every bad value refused naming its numbers; and the job refused
// when it would run (no executor yet) while `zerod check` accepts it.
#include <gtest/gtest.h>

#include "config_test_util.h"
#include "engine/config/config_error.h"

namespace zerod {
namespace {

using nlohmann::json;
using testing_config::contains;
using testing_config::job_with;
using testing_config::joined;
using testing_config::parse;
using testing_config::problems_of;
using testing_config::resolve_problems;

std::string pipeline_job(const json& parallelism, int accumulation = 8, int layers = 12) {
  return job_with({{"gradient_accumulation_steps", accumulation},
                   {"model", {{"n_layer", layers}}},
                   {"parallelism", parallelism}});
}

TEST(PipelineConfig, DefaultsAreOneStageAndTheJsonOfOneStageJobsKeepsItsLayout) {
  ParsedJob job = parse(job_with(json::object()));
  const ParallelismConfig& p = job.config.parallelism;
  EXPECT_EQ(p.pipeline, 1);
  EXPECT_EQ(p.pipeline_schedule, "1f1b");
  EXPECT_EQ(p.virtual_stages, 1);
  EXPECT_EQ(p.pipeline_partition, "uniform");
  resolve_job(job.config, 2);
  const json out = job_to_json(job.config);
  EXPECT_FALSE(out["resolved"]["layout"].contains("pipeline"));
  EXPECT_EQ(out["parallelism"]["pipeline"], 1);
}

TEST(PipelineConfig, StagesTheMeshAndTheRoundTrip) {
  ParsedJob job = parse(pipeline_job({{"pipeline", 4},
                                      {"pipeline_schedule", "zero_bubble"},
                                      {"pipeline_partition", "parameters"}}));
  resolve_job(job.config, 8);
  const JobConfig& c = job.config;
  EXPECT_EQ(c.parallelism.pipeline, 4);
  EXPECT_EQ(c.parallelism.pipeline_schedule, "zero_bubble");
  EXPECT_EQ(c.parallelism.pipeline_partition, "parameters");
  EXPECT_EQ(c.data_parallel_size, 2);
  EXPECT_EQ(c.global_batch(), 2 * 8 * 2);  // micro 2 x accumulation 8 x data-parallel 2
  const json r = job_to_json(c)["resolved"];
  EXPECT_EQ(r["layout"]["pipeline"], json::parse("[[0, 2, 4, 6], [1, 3, 5, 7]]"));
  EXPECT_EQ(r["layout"]["data"], json::parse("[[0, 1], [2, 3], [4, 5], [6, 7]]"));
  EXPECT_EQ(parse(job_to_json(c).dump()).config, c);
  // An explicit list, interleaved: P x V counts in global stage order.
  ParsedJob list = parse(pipeline_job({{"pipeline", 2},
                                       {"pipeline_schedule", "interleaved_1f1b"},
                                       {"virtual_stages", 2},
                                       {"pipeline_partition", {2, 4, 4, 2}}}));
  resolve_job(list.config, 2);
  EXPECT_EQ(list.config.parallelism.pipeline_partition, "explicit");
  EXPECT_EQ(list.config.parallelism.pipeline_layers, (std::vector<int>{2, 4, 4, 2}));
  EXPECT_EQ(job_to_json(list.config)["parallelism"]["pipeline_partition"],
            json::parse("[2, 4, 4, 2]"));
  EXPECT_EQ(parse(job_to_json(list.config).dump()).config, list.config);
  // GPipe takes fewer micro-batches than stages.
  EXPECT_TRUE(
      resolve_problems(pipeline_job({{"pipeline", 4}, {"pipeline_schedule", "gpipe"}}, 2), 4)
          .empty());
}

TEST(PipelineConfig, BadValuesAreNamedWithTheirNumbers) {
  const auto problems = [](const json& par, int layers = 12) {
    return problems_of(pipeline_job(par, 8, layers));
  };
  std::vector<std::string> p = problems({{"pipeline", 2}, {"pipeline_schedule", "zb"}});
  EXPECT_TRUE(contains(p,
                       "parallelism.pipeline_schedule: \"zb\" is not allowed (allowed: gpipe, "
                       "1f1b, interleaved_1f1b, zero_bubble)"))
      << joined(p);
  p = problems({{"pipeline", 4}}, 3);
  EXPECT_TRUE(contains(p,
                       "parallelism.pipeline: 4 pipeline stages for 3 layers: every stage "
                       "needs at least one layer"))
      << joined(p);
  p = problems({{"pipeline", 3}, {"pipeline_partition", {4, 4, 5}}});
  EXPECT_TRUE(contains(p,
                       "parallelism.pipeline_partition: the layer counts sum to 13, but the "
                       "model has 12 layers"))
      << joined(p);
  p = problems({{"pipeline", 3}, {"pipeline_partition", {6, 6}}});
  EXPECT_TRUE(contains(p, "a list of 2 layer counts for 3 stages")) << joined(p);
  p = problems({{"pipeline", 3}, {"pipeline_partition", {6, 0, 6}}});
  EXPECT_TRUE(contains(p, "parallelism.pipeline_partition[1]: 0 is out of range")) << joined(p);
  p = problems({{"pipeline", 2}, {"pipeline_partition", "layers"}});
  EXPECT_TRUE(contains(p, "(allowed: uniform, parameters)")) << joined(p);
  p = problems({{"pipeline", 2}, {"virtual_stages", 2}});
  EXPECT_TRUE(contains(p,
                       "parallelism.virtual_stages: 2 virtual stages need "
                       "\"pipeline_schedule\": \"interleaved_1f1b\" (the schedule is \"1f1b\")"))
      << joined(p);
  p = problems({{"pipeline", 2}, {"pipeline_schedule", "interleaved_1f1b"}, {"virtual_stages", 5}});
  EXPECT_TRUE(contains(p,
                       "parallelism.virtual_stages: 5 does not divide the 12 layers "
                       "(model.n_layer)"))
      << joined(p);
  // The micro-batches (gradient_accumulation_steps) the schedule needs, at resolve time.
  p = resolve_problems(pipeline_job({{"pipeline", 4}}, 2), 4);
  EXPECT_TRUE(contains(p,
                       "parallelism.pipeline_schedule: \"1f1b\" needs at least as many "
                       "micro-batches as pipeline stages: 2 micro-batches "
                       "(gradient_accumulation_steps) < 4 stages"))
      << joined(p);
  p = resolve_problems(
      pipeline_job(
          {{"pipeline", 4}, {"pipeline_schedule", "interleaved_1f1b"}, {"virtual_stages", 2}}, 6),
      4);
  EXPECT_TRUE(contains(p, "6 micro-batches (gradient_accumulation_steps) is not a multiple of 4"))
      << joined(p);
  p = resolve_problems(pipeline_job({{"pipeline", 4}}), 6);
  EXPECT_TRUE(contains(p,
                       "world size 6 is not divisible by parallelism.pipeline 4 x "
                       "parallelism.tensor 1 x parallelism.context 1 = 4"))
      << joined(p);
}

TEST(PipelineConfig, EveryScheduleRuns) {
  for (const char* schedule : {"gpipe", "1f1b", "zero_bubble"}) {
    ParsedJob job = parse(pipeline_job({{"pipeline", 2}, {"pipeline_schedule", schedule}}));
    resolve_job(job.config, 2);
    EXPECT_NO_THROW(check_supported(job.config)) << schedule;
  }
  ParsedJob job = parse(pipeline_job(
      {{"pipeline", 2}, {"pipeline_schedule", "interleaved_1f1b"}, {"virtual_stages", 2}}, 4));
  resolve_job(job.config, 2);
  EXPECT_NO_THROW(check_supported(job.config));
  ParsedJob one = parse(job_with(json::object()));
  resolve_job(one.config, 1);
  EXPECT_NO_THROW(check_supported(one.config));
}

// PowerSGD and the 1-bit optimizers run with pipelines (per stage, over its data-parallel
// group); the 1-bit optimizers with pipelines and tensor parallelism are refused, naming the key.
TEST(PipelineConfig, PowerSgdAndTheOneBitOptimizersCombine) {
  ParsedJob psgd = parse(job_with({{"gradient_accumulation_steps", 8},
                                   {"model", {{"n_layer", 12}}},
                                   {"parallelism", {{"pipeline", 2}}},
                                   {"communication_compression", {{"type", "powersgd"}}}}));
  resolve_job(psgd.config, 4);
  EXPECT_NO_THROW(check_supported(psgd.config));
  for (const char* type : {"OneBitAdam", "ZeroOneAdam", "OneBitLamb"}) {
    ParsedJob job = parse(job_with({{"gradient_accumulation_steps", 8},
                                    {"model", {{"n_layer", 12}}},
                                    {"parallelism", {{"pipeline", 2}}},
                                    {"optimizer", {{"type", type}, {"params", {{"lr", 1e-3}}}}}}));
    resolve_job(job.config, 4);
    EXPECT_NO_THROW(check_supported(job.config)) << type;
    ParsedJob tp = parse(job_with({{"gradient_accumulation_steps", 8},
                                   {"model", {{"n_layer", 12}}},
                                   {"parallelism", {{"pipeline", 2}, {"tensor", 2}}},
                                   {"optimizer", {{"type", type}, {"params", {{"lr", 1e-3}}}}}}));
    resolve_job(tp.config, 4);
    EXPECT_NO_THROW(check_supported(tp.config)) << type << " with tensor parallelism";
  }
}

}  // namespace
}  // namespace zerod
