// The elasticity section: DeepSpeed's elastic batch computation against DeepSpeed's own results,
// table-driven (elasticity_table.h: generated once by elasticity_reference.py beside this file,
// which runs DeepSpeed's deepspeed/elasticity/elasticity.py on each row; see its header for the
// commit and the command), then the section's bad input, the batch keys it takes over, and the
// job resolved for a world size (the trainer's batch).
#include <gtest/gtest.h>

#include <algorithm>

#include "config_test_util.h"
#include "elasticity_table.h"
#include "engine/config/elasticity.h"
#include "engine/config/sections.h"

namespace zerod {
namespace {

using nlohmann::json;
using testing_config::contains;
using testing_config::joined;
using testing_config::parse;
using testing_config::problems_of;
using testing_config::resolve_problems;

// The section alone through the job file's reader: its problems, or none and the config.
std::vector<std::string> read_section(const std::string& section, ElasticityConfig& out) {
  const json root = {{"elasticity", json::parse(section)}};
  config::Problems problems;
  config::ObjectReader top(root, "", problems);
  JobConfig cfg;
  config::read_elasticity(top, cfg);
  out = cfg.elasticity;
  return problems.errors;
}

std::string first_problem(const ConfigError& e) {
  return e.problems().empty() ? std::string() : e.problems().front();
}

// The piece of zerod's message for each exception DeepSpeed raises (or a None list).
bool message_matches(const std::string& ds_error, const std::string& message) {
  auto has = [&](const char* piece) { return message.find(piece) != std::string::npos; };
  const std::string& e = ds_error;
  if (e == "ValueError") return has("elasticity.micro_batch_sizes: ") && has(" is above ");
  if (e == "ElasticityError") return has("elasticity.num_gpus_per_node: ");
  if (e == "ElasticityConfigError")
    return has("elasticity.model_parallel_size: ") || has("elasticity.version: ");
  if (e == "NotImplementedError") return has("elasticity.version: ");
  if (e == "TypeError" || e == "None") return has("no world size") || has("no node count");
  return false;
}

TEST(Elasticity, MatchesDeepSpeedOnEveryTableRow) {
  const auto& rows = elasticity_table::rows();
  ASSERT_GT(rows.size(), 300u);
  int checked = 0, errors = 0, triangles = 0;
  for (const elasticity_table::Row& row : rows) {
    SCOPED_TRACE(::testing::Message() << (row.kind == elasticity_table::kEntry ? "entry" : "v02")
                                      << " " << row.section << " world " << row.world);
    const std::string ds_error = row.error;
    ElasticityConfig c;
    const std::vector<std::string> problems = read_section(row.section, c);
    if (!problems.empty()) {  // refused as the section is read: the versions DeepSpeed refuses
      EXPECT_TRUE(message_matches(ds_error, problems.front())) << joined(problems);
      ++errors;
      continue;
    }
    ElasticBatch b;
    try {
      b = elastic_batch(c, row.world);
    } catch (const ConfigError& e) {
      // No valid size at all: DeepSpeed returns an empty (or None) list, then refuses every
      // world size.
      const bool none_valid =
          ds_error == "ElasticityIncompatibleWorldSize" || (row.batch >= 0 && row.valid.empty());
      EXPECT_TRUE(message_matches(ds_error, first_problem(e)) ||
                  (none_valid && first_problem(e).find("no world size") != std::string::npos))
          << first_problem(e);
      ++errors;
      continue;
    }
    if (row.kind == elasticity_table::kV02 || row.world == 0) {
      EXPECT_TRUE(ds_error.empty()) << "DeepSpeed raised " << ds_error;
      EXPECT_EQ(b.train_batch_size, row.batch);
      EXPECT_EQ(b.valid_sizes, row.valid);
      ++checked;
      continue;
    }
    // compute_elastic_config(world_size=W): W among the valid sizes, then the largest
    // micro-batch size dividing batch // W.
    const bool valid = std::count(b.valid_sizes.begin(), b.valid_sizes.end(), row.world) > 0;
    if (!valid) {
      EXPECT_EQ(ds_error, "ElasticityIncompatibleWorldSize");
      ++errors;
    } else {
      EXPECT_TRUE(ds_error.empty()) << "DeepSpeed raised " << ds_error;
      EXPECT_EQ(b.train_batch_size, row.batch);
      EXPECT_EQ(b.valid_sizes, row.valid);
      EXPECT_EQ(elastic_micro_batch(c, b.train_batch_size, row.world), row.micro);
      ++checked;
    }
    // The trainer's triangle (no model parallelism: the same world size DeepSpeed was given).
    if (c.model_parallel_size != 1) continue;
    try {
      const ElasticTriangle t = elastic_triangle(c, row.world, 1);
      EXPECT_TRUE(valid && row.batch > 0);
      EXPECT_EQ(t.train_batch_size, row.batch);
      EXPECT_EQ(t.micro_batch, row.micro);
      EXPECT_EQ(t.grad_accum, row.batch / (row.micro * row.world));
      EXPECT_EQ(t.train_batch_size, t.micro_batch * t.grad_accum * t.data_parallel_size);
      ++triangles;
    } catch (const ConfigError& e) {
      if (!valid) {
        EXPECT_NE(first_problem(e).find(
                      fmt::format("world size {} is not valid for elasticity", row.world)),
                  std::string::npos)
            << first_problem(e);
      } else {  // DeepSpeed's batch 0 (no multiple within the cap), refused here
        EXPECT_EQ(row.batch, 0) << first_problem(e);
        EXPECT_NE(first_problem(e).find("finds no batch"), std::string::npos) << first_problem(e);
      }
    }
  }
  // Most rows compare numbers; every kind of refusal is in the table.
  EXPECT_GT(checked, 150);
  EXPECT_GT(errors, 20);
  EXPECT_GT(triangles, 100);
}

// DeepSpeed's published numbers (tests/unit/elasticity/test_elastic.py).
TEST(Elasticity, DeepSpeedsOwnTestValues) {
  ElasticityConfig c;
  c.enabled = true;
  c.max_train_batch_size = 10000;
  c.micro_batch_sizes = {8, 12, 16, 17};
  c.min_gpus = 32;
  c.max_gpus = 1500;
  c.version = 0.1;
  const ElasticBatch b = elastic_shared_batch(c);
  EXPECT_EQ(b.train_batch_size, 9792);
  EXPECT_EQ(b.valid_sizes.size(), 23u);
  EXPECT_EQ(elastic_triangle(c, 64, 1).micro_batch, 17);  // test_valid_world_size
  c.max_train_batch_size = 32;                            // test_proper_mbsz
  c.micro_batch_sizes = {1, 2, 3, 7};
  c.min_gpus = 1;
  EXPECT_EQ(elastic_triangle(c, 4, 1).micro_batch, 3);
  c.max_train_batch_size = 100;  // test_batch_size_within_max
  c.micro_batch_sizes = {8, 10, 12};
  EXPECT_LE(elastic_shared_batch(c).train_batch_size, 100);
}

json elastic_job(const json& section, const json& extra = json::object()) {
  json j = {{"train", {{"steps", 10}}}, {"elasticity", section}};
  j.merge_patch(extra);
  return j;
}

const json kSection = {{"enabled", true},
                       {"max_train_batch_size", 2000},
                       {"micro_batch_sizes", {2, 4, 6}},
                       {"min_gpus", 1},
                       {"max_gpus", 16},
                       {"version", 0.1}};

TEST(Elasticity, TheJobTakesItsBatchForTheWorldSize) {
  // v0.1, [2, 4, 6] within 2000 on 1-16 GPUs: 1680 trains on 1-8, 10, 12, 14, 15 (the table's
  // row for max_gpus 16).
  ParsedJob job = parse(elastic_job(kSection).dump());
  EXPECT_FALSE(job.config.train_batch_size.has_value());
  resolve_job(job.config, 4);
  EXPECT_EQ(job.config.global_batch(), 1680);
  EXPECT_EQ(job.config.micro_batch(), 6);  // 1680 / 4 = 420 = 6 x 70
  EXPECT_EQ(job.config.grad_accum(), 70);
  resolve_job(job.config, 15);  // 112 per rank: 6 does not divide it, 4 does
  EXPECT_EQ(job.config.global_batch(), 1680);
  EXPECT_EQ(job.config.micro_batch(), 4);
  EXPECT_EQ(job.config.grad_accum(), 28);
  // A world size outside the set: exit 2 naming it and the valid ones.
  const auto problems = resolve_problems(elastic_job(kSection).dump(), 16);
  EXPECT_TRUE(contains(problems,
                       "world size 16 is not valid for elasticity (version 0.1, "
                       "train_batch_size 1680): the valid world sizes are 1, 2, 3, 4, "
                       "5, 6, 7, 8, 10, 12, 14, 15"))
      << joined(problems);
  // The resolved job reads back to the same config (its batch keys are elasticity's), and
  // keys that do not match its world size are caught.
  EXPECT_EQ(parse(job_to_json(job.config).dump()).config, job.config);
  json bad = job_to_json(job.config);
  bad["gradient_accumulation_steps"] = 10;
  EXPECT_TRUE(contains(problems_of(bad.dump()),
                       "gradient_accumulation_steps: 10 does not match elasticity's 28 for "
                       "resolved.world_size 15"));
  bad = job_to_json(job.config);
  bad["resolved"]["world_size"] = 16;
  bad["resolved"]["data_parallel_size"] = 16;
  bad["resolved"].erase("layout");
  EXPECT_TRUE(contains(problems_of(bad.dump()), "resolved.world_size: world size 16 is not valid"));
  // An unresolved job reads back too.
  const ParsedJob fresh = parse(elastic_job(kSection).dump());
  EXPECT_EQ(parse(job_to_json(fresh.config).dump()).config, fresh.config);
}

TEST(Elasticity, Version01CountsDataParallelRanks) {
  // Tensor parallelism 2: the sizes are data-parallel sizes (DeepSpeed's engine hands v0.1 the
  // data-parallel world), so 8 ranks train as data-parallel 4: 1680 = 6 x 70 x 4.
  ParsedJob job = parse(elastic_job(kSection, {{"parallelism", {{"tensor", 2}}}}).dump());
  resolve_job(job.config, 8);
  EXPECT_EQ(job.config.data_parallel_size, 4);
  EXPECT_EQ(job.config.global_batch(), 1680);
  EXPECT_EQ(job.config.micro_batch(), 6);
  EXPECT_EQ(job.config.grad_accum(), 70);
  EXPECT_NE(format_elastic_plan(job.config)
                .find("          30             15            4            28          1680\n"),
            std::string::npos)
      << format_elastic_plan(job.config);
  const auto problems =
      resolve_problems(elastic_job(kSection, {{"parallelism", {{"tensor", 2}}}}).dump(), 32);
  EXPECT_TRUE(contains(problems,
                       "world size 32 (data-parallel size 16) is not valid for "
                       "elasticity (version 0.1, train_batch_size 1680): the valid world "
                       "sizes are 2, 4, 6, 8, 10, 12, 14, 16, 20, 24, 28, 30"))
      << joined(problems);
}

TEST(Elasticity, Version02WithModelParallelism) {
  // Tensor parallelism 2 on nodes of 2 GPUs: one data-parallel rank per node. The table's
  // _get_compatible_gpus_v02 row for 8 GPUs: batch 1680, data-parallel 4 is valid; the largest
  // micro-batch dividing 1680 / 4 = 420 is 6: accumulation 70.
  json section = kSection;
  section.merge_patch({{"version", 0.2},
                       {"max_gpus", 10000},
                       {"model_parallel_size", 2},
                       {"num_gpus_per_node", 2}});
  ParsedJob job = parse(elastic_job(section, {{"parallelism", {{"tensor", 2}}}}).dump());
  resolve_job(job.config, 8);
  EXPECT_EQ(job.config.data_parallel_size, 4);
  EXPECT_EQ(job.config.global_batch(), 1680);
  EXPECT_EQ(job.config.micro_batch(), 6);
  EXPECT_EQ(job.config.grad_accum(), 70);
  // model_parallel_size must be the ranks of one replica.
  EXPECT_TRUE(contains(problems_of(elastic_job(section).dump()),
                       "elasticity.model_parallel_size: 2 does not match the ranks of one model "
                       "replica, parallelism.tensor 1 x parallelism.context 1 = 1"));
}

TEST(Elasticity, Version02GivesAnUnlistedWorldItsOwnBatch) {
  // v0.2, 4 GPUs per node: the shared sizes are multiples of 4; 6 GPUs get 1992 = 83 x 4 x 6
  // (the largest multiple of micro x 6 within 2000, micro 4 and 6 giving 1992 and 1980).
  json section = kSection;
  section.merge_patch({{"version", 0.2}, {"max_gpus", 10000}, {"num_gpus_per_node", 4}});
  ParsedJob job = parse(elastic_job(section).dump());
  resolve_job(job.config, 6);
  EXPECT_EQ(job.config.global_batch(), 1992);
  EXPECT_EQ(job.config.micro_batch(), 4);  // 1992 / 6 = 332: 4 divides it, 6 does not
  EXPECT_EQ(job.config.grad_accum(), 83);
  EXPECT_NE(elastic_summary(job.config).find("this world size's own batch"), std::string::npos);
  resolve_job(job.config, 8);
  EXPECT_EQ(job.config.global_batch(), 1920);
}

TEST(Elasticity, TheBatchKeysItTakesOver) {
  // DeepSpeed refuses them unless ignore_non_elastic_batch_info; then they are ignored.
  const json with_batch = elastic_job(kSection, {{"train_batch_size", 8}});
  EXPECT_TRUE(contains(problems_of(with_batch.dump()),
                       "train_batch_size: 8 is set with elasticity.enabled: elasticity sets "
                       "train_batch_size, train_micro_batch_size_per_gpu and "
                       "gradient_accumulation_steps for the world size; remove it, or set "
                       "elasticity.ignore_non_elastic_batch_info: true to have it ignored"))
      << joined(problems_of(with_batch.dump()));
  json section = kSection;
  section["ignore_non_elastic_batch_info"] = true;
  ParsedJob job = parse(elastic_job(section, {{"train_micro_batch_size_per_gpu", 3}}).dump());
  EXPECT_TRUE(contains(job.warnings, "train_micro_batch_size_per_gpu: 3 is ignored"));
  resolve_job(job.config, 2);
  EXPECT_EQ(job.config.micro_batch(), 6);  // 1680 / 2 = 840 = 6 x 140
  EXPECT_EQ(job.config.global_batch(), 1680);
  // A disabled section changes nothing (its keys are still checked), and reads back.
  json off = kSection;
  off["enabled"] = false;
  ParsedJob plain = parse(testing_config::job_with({{"elasticity", off}}));
  resolve_job(plain.config, 2);
  EXPECT_EQ(plain.config.global_batch(), 4);  // micro 2 x 1 x 2
  EXPECT_EQ(parse(job_to_json(plain.config).dump()).config, plain.config);
  off["min_gpus"] = 0;
  EXPECT_TRUE(contains(problems_of(testing_config::job_with({{"elasticity", off}})),
                       "elasticity.min_gpus: 0 is out of range"));
}

TEST(Elasticity, BadInputNamesTheKeyAndValue) {
  struct Case {
    json patch;  // merged into kSection (null removes a key)
    const char* expect;
  };
  const Case cases[] = {
      {{{"max_train_batch_size", nullptr}},
       "elasticity.max_train_batch_size: required when elasticity.enabled is true"},
      {{{"micro_batch_sizes", nullptr}},
       "elasticity.micro_batch_sizes: required when elasticity.enabled is true"},
      {{{"micro_batch_sizes", 5}}, "elasticity.micro_batch_sizes: expected a list of integers"},
      {{{"micro_batch_sizes", json::array()}},
       "elasticity.micro_batch_sizes: must list at least one micro-batch size"},
      {{{"micro_batch_sizes", {1, 4, -1}}}, "elasticity.micro_batch_sizes[2]: -1 is out of range"},
      {{{"micro_batch_sizes", json(std::vector<int>(65, 2))}},
       "elasticity.micro_batch_sizes: lists 65 sizes; at most 64 are allowed"},
      {{{"micro_batch_sizes", {2, 0.5, 4}}},
       "elasticity.micro_batch_sizes[1]: expected an integer, got 0.5"},
      {{{"micro_batch_sizes", {4, 3000}}},
       "elasticity.micro_batch_sizes: 3000 is above max_train_batch_size 2000"},
      {{{"min_gpus", -1}}, "elasticity.min_gpus: -1 is out of range"},
      {{{"max_gpus", -1}}, "elasticity.max_gpus: -1 is out of range"},
      {{{"min_gpus", 8}, {"max_gpus", 4}}, "elasticity.max_gpus: 4 is below min_gpus 8"},
      {{{"min_time", -1}}, "elasticity.min_time: -1"},
      {{{"version", 0.3}},
       "elasticity.version: 0.3 is not an elasticity version (allowed: 0.1, "
       "0.2)"},
      {{{"version", "0.2"}}, "elasticity.version: expected"},
      {{{"model_parallel_size", 2}},
       "elasticity.model_parallel_size: 2 needs version 0.2 (version 0.1 has no model "
       "parallelism)"},
      {{{"max_gpu", 4}}, "elasticity.max_gpu: unknown key; did you mean 'max_gpus'?"},
      {{{"enabled", "yes"}}, "elasticity.enabled: expected a boolean"},
      {{{"min_gpus", 1000},
        {"max_gpus", 1000},
        {"max_train_batch_size", 100},
        {"micro_batch_sizes", {7}}},
       "elasticity: no world size in [min_gpus, max_gpus] trains any candidate batch (min_gpus "
       "1000, max_gpus 1000, micro_batch_sizes [7], max_train_batch_size 100)"},
  };
  for (const Case& c : cases) {
    json section = kSection;
    section.merge_patch(c.patch);
    const auto problems = problems_of(elastic_job(section).dump());
    EXPECT_TRUE(contains(problems, c.expect)) << c.patch << "\n" << joined(problems);
  }
  // v0.2: whole replicas per node; the cap per node.
  json v2 = kSection;
  v2.merge_patch({{"version", 0.2}, {"model_parallel_size", 4}, {"num_gpus_per_node", 6}});
  EXPECT_TRUE(
      contains(problems_of(elastic_job(v2, {{"parallelism", {{"tensor", 4}}}}).dump()),
               "elasticity.num_gpus_per_node: 6 is not divisible by model_parallel_size 4"));
  v2.merge_patch(
      {{"model_parallel_size", 1}, {"num_gpus_per_node", 8}, {"micro_batch_sizes", {300}}});
  EXPECT_TRUE(contains(problems_of(elastic_job(v2).dump()),
                       "elasticity.micro_batch_sizes: 300 is above max_train_batch_size 2000 / 8 "
                       "data-parallel ranks per node = 250"));
}

// DeepSpeed's ensure_immutable_elastic_config (its TestElasticConfigChanged: the scheduler saw
// max_train_batch_size 27, the job says 4).
TEST(Elasticity, TheSchedulersCopyMustAgree) {
  ElasticityConfig ours;
  ASSERT_TRUE(read_section(R"({"enabled": true, "max_train_batch_size": 4,
      "micro_batch_sizes": [1, 2, 3, 4], "min_gpus": 1, "max_gpus": 4, "version": 0.1})",
                           ours)
                  .empty());
  // The same keys, min/max_gpus changed (not compared, as in DeepSpeed): accepted.
  check_scheduler_elastic_config(ours, R"({"enabled": true, "max_train_batch_size": 4,
      "micro_batch_sizes": [1, 2, 3, 4], "max_gpus": 8, "version": 0.1})");
  auto problem = [&](const std::string& scheduler) {
    try {
      check_scheduler_elastic_config(ours, scheduler);
    } catch (const ConfigError& e) {
      return first_problem(e);
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(problem(R"({"enabled": true, "max_train_batch_size": 27,
      "micro_batch_sizes": [1, 2, 3, 4], "version": 0.1})"),
            "DEEPSPEED_ELASTICITY_CONFIG: the resource scheduler's elasticity section has "
            "max_train_batch_size 27 (the job's: 4); it would scale the job to world sizes of "
            "another batch (DeepSpeed's ensure_immutable_elastic_config)");
  // Read with the section's defaults: no version is 0.2, and the micro-batch sizes differ too.
  EXPECT_NE(problem(R"({"enabled": true, "max_train_batch_size": 4, "micro_batch_sizes": [4]})")
                .find("micro_batch_sizes [4] (the job's: [1, 2, 3, 4]), version 0.2 (the job's: "
                      "0.1)"),
            std::string::npos);
  EXPECT_NE(problem("{nope").find("DEEPSPEED_ELASTICITY_CONFIG (the resource scheduler's "
                                  "elasticity section): parse error"),
            std::string::npos)
      << problem("{nope");
  EXPECT_NE(problem(R"({"enabled": true, "max_train_batch_size": 4})")
                .find("elasticity.micro_batch_sizes: required"),
            std::string::npos);
}

TEST(Elasticity, CheckPrintsEachValidWorldSizesTriangle) {
  json section = kSection;
  section["max_gpus"] = 4;
  ParsedJob job = parse(elastic_job(section).dump());
  resolve_job(job.config, 2);
  const std::string plan = format_elastic_plan(job.config);
  // 1680 on 1, 2, 3, 4 ranks: 1680 = 840 x 2 beats 1440 (360 x 4, 240 x 6, 120 x 12), which
  // trains on the same 4 (prefer_larger_batch).
  EXPECT_NE(plan.find("elasticity (version 0.1): train_batch_size 1680 on 4 valid world sizes "
                      "(min_gpus 1, max_gpus 4, micro_batch_sizes [2, 4, 6], "
                      "max_train_batch_size 2000)\n"),
            std::string::npos)
      << plan;
  // world size, data-parallel, micro-batch, accumulation, global batch: 560 per rank on 3 is
  // not a multiple of 6, it is of 4.
  EXPECT_NE(plan.find("           3              3            4           140          1680\n"),
            std::string::npos)
      << plan;
  EXPECT_NE(plan.find("           4              4            6            70          1680\n"),
            std::string::npos)
      << plan;
  EXPECT_NE(plan.find("this job: elasticity v0.1: world size 2 -> micro-batch 6 x accumulation "
                      "140 x data-parallel 2 = train_batch_size 1680 (4 valid world sizes)"),
            std::string::npos)
      << plan;
}

}  // namespace
}  // namespace zerod
