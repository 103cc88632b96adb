// DeepSpeed's 1-bit optimizers in the job file: defaults and keys of each type, and the
// combinations they cannot serve refused at parse time (zerod check: exit 2) naming the key.
#include <gtest/gtest.h>

#include "tests/unit/engine/config/config_test_util.h"

namespace zerod {
namespace {

using nlohmann::json;
using testing_config::contains;
using testing_config::job_with;
using testing_config::joined;
using testing_config::parse;
using testing_config::problems_of;

TEST(OnebitConfig, DeepSpeedDefaultsAndKeys) {
  const ParsedJob a = parse(job_with({{"optimizer", {{"type", "onebitadam"}}}}));
  const OptimizerConfig& o = a.config.optimizer;
  EXPECT_EQ(o.type, "OneBitAdam");
  EXPECT_EQ(o.onebit.freeze_step, 100000);
  EXPECT_FALSE(o.onebit.cuda_aware);
  EXPECT_EQ(o.onebit.comm_backend_name, "nccl");
  EXPECT_FALSE(o.bias_correction);  // DeepSpeed's 1-bit update has none
  EXPECT_TRUE(o.adam_w_mode);
  const ParsedJob b = parse(job_with({{"optimizer",
                                       {{"type", "OneBitAdam"},
                                        {"params",
                                         {{"lr", 2e-3},
                                          {"freeze_step", 7},
                                          {"cuda_aware", true},
                                          {"comm_backend_name", "mpi"},
                                          {"betas", {0.8, 0.99}},
                                          {"weight_decay", 0.1},
                                          {"bias_correction", true}}}}}}));
  EXPECT_EQ(b.config.optimizer.onebit.freeze_step, 7);
  EXPECT_TRUE(b.config.optimizer.onebit.cuda_aware);
  EXPECT_EQ(b.config.optimizer.onebit.comm_backend_name, "mpi");
  EXPECT_EQ(b.config.optimizer.beta1, 0.8);
  // freeze_step at or past train.steps (10): a warning.
  EXPECT_TRUE(b.warnings.empty()) << joined(b.warnings);
  const ParsedJob c =
      parse(job_with({{"optimizer", {{"type", "OneBitAdam"}, {"params", {{"freeze_step", 10}}}}}}));
  ASSERT_EQ(c.warnings.size(), 1u) << joined(c.warnings);
  EXPECT_NE(c.warnings[0].find("optimizer.params.freeze_step: 10 is not below train.steps 10"),
            std::string::npos)
      << c.warnings[0];
}

TEST(OnebitConfig, OneBitLambKeysDefaultsAndClamps) {
  const ParsedJob a = parse(job_with({{"optimizer", {{"type", "OneBitLamb"}}}}));
  const OnebitConfig& d = a.config.optimizer.onebit;
  EXPECT_EQ(a.config.optimizer.type, "OneBitLamb");
  EXPECT_EQ(d.freeze_step, 100000);
  EXPECT_EQ(d.max_coeff, 10.0);
  EXPECT_EQ(d.min_coeff, 0.01);
  EXPECT_EQ(d.coeff_beta, 0.9);
  EXPECT_EQ(d.factor_max, 4.0);
  EXPECT_EQ(d.factor_min, 0.5);
  EXPECT_EQ(d.factor_threshold, 0.1);
  const ParsedJob b = parse(job_with({{"optimizer",
                                       {{"type", "OneBitLamb"},
                                        {"params",
                                         {{"freeze_step", 3},
                                          {"max_coeff", 5.0},
                                          {"min_coeff", 0.1},
                                          {"coeff_beta", 0.8},
                                          {"factor_max", 2.0},
                                          {"factor_min", 0.25},
                                          {"factor_threshold", 0.2}}}}}}));
  EXPECT_TRUE(b.warnings.empty()) << joined(b.warnings);  // implemented: parse() throws otherwise
  const OnebitConfig& c = b.config.optimizer.onebit;
  EXPECT_EQ(c.freeze_step, 3);
  EXPECT_EQ(c.max_coeff, 5.0);
  EXPECT_EQ(c.min_coeff, 0.1);
  EXPECT_EQ(c.coeff_beta, 0.8);
  EXPECT_EQ(c.factor_max, 2.0);
  EXPECT_EQ(c.factor_min, 0.25);
  EXPECT_EQ(c.factor_threshold, 0.2);
  EXPECT_TRUE(contains(
      problems_of(
          job_with({{"optimizer", {{"type", "OneBitLamb"}, {"params", {{"min_coeff", 20.0}}}}}})),
      "optimizer.params.min_coeff: 20 is above max_coeff 10"));
  EXPECT_TRUE(contains(
      problems_of(
          job_with({{"optimizer", {{"type", "OneBitLamb"}, {"params", {{"factor_min", 5.0}}}}}})),
      "optimizer.params.factor_min: 5 is above factor_max 4"));
  EXPECT_TRUE(contains(
      problems_of(job_with(
          {{"optimizer", {{"type", "OneBitLamb"}, {"params", {{"var_update_scaler", 4}}}}}})),
      "optimizer.params.var_update_scaler"));
  EXPECT_TRUE(contains(
      problems_of(job_with(
          {{"optimizer", {{"type", "OneBitLamb"}}}, {"zero_optimization", {{"stage", 2}}}})),
      "zero_optimization.stage: 2 with optimizer OneBitLamb: the 1-bit optimizers need stage 0"));
}

TEST(OnebitConfig, UnknownKeysAndBadValuesNameTheKey) {
  const auto other = problems_of(
      job_with({{"optimizer", {{"type", "OneBitAdam"}, {"params", {{"var_freeze_step", 5}}}}}}));
  ASSERT_FALSE(other.empty());
  EXPECT_TRUE(contains(other, "optimizer.params.var_freeze_step")) << joined(other);
  EXPECT_TRUE(contains(other, "freeze_step")) << joined(other);  // the valid keys are listed
  EXPECT_TRUE(contains(
      problems_of(job_with(
          {{"optimizer", {{"type", "OneBitAdam"}, {"params", {{"comm_backend_name", "gloo"}}}}}})),
      "optimizer.params.comm_backend_name"));
  EXPECT_TRUE(contains(
      problems_of(
          job_with({{"optimizer", {{"type", "OneBitAdam"}, {"params", {{"freeze_step", -1}}}}}})),
      "optimizer.params.freeze_step"));
  EXPECT_TRUE(contains(
      problems_of(
          job_with({{"optimizer", {{"type", "OneBitAdam"}, {"params", {{"amsgrad", true}}}}}})),
      "optimizer.params.amsgrad"));
}

TEST(OnebitConfig, OtherStagesAndOffloadAreRefused) {
  const json onebit = {{"type", "OneBitAdam"}, {"params", {{"freeze_step", 2}}}};
  for (int stage : {1, 2, 3}) {
    const auto p =
        problems_of(job_with({{"optimizer", onebit}, {"zero_optimization", {{"stage", stage}}}}));
    EXPECT_TRUE(contains(p, "zero_optimization.stage: " + std::to_string(stage) +
                                " with optimizer OneBitAdam: the 1-bit optimizers need stage 0"))
        << joined(p);
  }
  const auto off = problems_of(
      job_with({{"optimizer", onebit},
                {"zero_optimization", {{"stage", 3}, {"offload_param", {{"device", "cpu"}}}}}}));
  EXPECT_TRUE(contains(off,
                       "zero_optimization.offload_param.device: offload cannot be combined "
                       "with optimizer OneBitAdam"))
      << joined(off);
  // GPU ranks are fine (the states and the update go to the host), but not with offload keys.
  EXPECT_TRUE(
      problems_of(job_with({{"optimizer", onebit}, {"train", {{"device", "cuda"}}}})).empty());
  // Tensor and context parallelism combine (each rank compresses its own slices).
  EXPECT_TRUE(
      problems_of(job_with({{"optimizer", onebit}, {"parallelism", {{"tensor", 2}}}})).empty());
  // fp16 and bf16 at stage 0 are fine.
  EXPECT_TRUE(
      problems_of(job_with({{"optimizer", onebit}, {"fp16", {{"enabled", true}}}})).empty());
  EXPECT_TRUE(
      problems_of(job_with({{"optimizer", onebit}, {"bf16", {{"enabled", true}}}})).empty());
}

TEST(OnebitConfig, ZeroOneAdamKeysDefaultsAndRefusals) {
  const ParsedJob a = parse(job_with({{"optimizer", {{"type", "zerooneadam"}}}}));
  const OnebitConfig& d = a.config.optimizer.onebit;
  EXPECT_EQ(a.config.optimizer.type, "ZeroOneAdam");
  EXPECT_EQ(d.var_freeze_step, 100000);  // DeepSpeed's defaults
  EXPECT_EQ(d.var_update_scaler, 16);
  EXPECT_EQ(d.local_step_scaler, 32678);
  EXPECT_EQ(d.local_step_clipper, 16);
  EXPECT_FALSE(a.config.optimizer.bias_correction);
  const ParsedJob b = parse(job_with({{"optimizer",
                                       {{"type", "ZeroOneAdam"},
                                        {"params",
                                         {{"lr", 1e-3},
                                          {"var_freeze_step", 5},
                                          {"var_update_scaler", 2},
                                          {"local_step_scaler", 3},
                                          {"local_step_clipper", 4},
                                          {"cuda_aware", false},
                                          {"comm_backend_name", "nccl"}}}}}}));
  EXPECT_TRUE(b.warnings.empty()) << joined(b.warnings);  // implemented: accepted at stage 0
  const OnebitConfig& c = b.config.optimizer.onebit;
  EXPECT_EQ(c.var_freeze_step, 5);
  EXPECT_EQ(c.var_update_scaler, 2);
  EXPECT_EQ(c.local_step_scaler, 3);
  EXPECT_EQ(c.local_step_clipper, 4);
  // var_freeze_step at or past train.steps (10): a warning naming it.
  const ParsedJob w = parse(
      job_with({{"optimizer", {{"type", "ZeroOneAdam"}, {"params", {{"var_freeze_step", 12}}}}}}));
  ASSERT_EQ(w.warnings.size(), 1u) << joined(w.warnings);
  EXPECT_NE(w.warnings[0].find("optimizer.params.var_freeze_step: 12 is not below train.steps 10"),
            std::string::npos)
      << w.warnings[0];
  // OneBitAdam's freeze_step is not 0/1 Adam's key; zero intervals are errors.
  const auto other = problems_of(
      job_with({{"optimizer", {{"type", "ZeroOneAdam"}, {"params", {{"freeze_step", 5}}}}}}));
  EXPECT_TRUE(contains(other, "optimizer.params.freeze_step")) << joined(other);
  EXPECT_TRUE(contains(other, "var_freeze_step")) << joined(other);  // the valid keys are listed
  for (const char* key : {"var_update_scaler", "local_step_scaler", "local_step_clipper"}) {
    const auto p =
        problems_of(job_with({{"optimizer", {{"type", "ZeroOneAdam"}, {"params", {{key, 0}}}}}}));
    EXPECT_TRUE(contains(p, std::string("optimizer.params.") + key)) << joined(p);
  }
  // The other 1-bit optimizers' restrictions.
  const json zo = {{"type", "ZeroOneAdam"}};
  const auto stage =
      problems_of(job_with({{"optimizer", zo}, {"zero_optimization", {{"stage", 1}}}}));
  EXPECT_TRUE(contains(stage,
                       "zero_optimization.stage: 1 with optimizer ZeroOneAdam: the 1-bit "
                       "optimizers need stage 0"))
      << joined(stage);
  const auto off = problems_of(job_with(
      {{"optimizer", zo},
       {"zero_optimization", {{"stage", 2}, {"offload_optimizer", {{"device", "cpu"}}}}}}));
  EXPECT_TRUE(contains(off,
                       "zero_optimization.offload_optimizer.device: offload cannot be combined "
                       "with optimizer ZeroOneAdam"))
      << joined(off);
  EXPECT_TRUE(problems_of(job_with({{"optimizer", zo}, {"train", {{"device", "cuda"}}}})).empty());
  EXPECT_TRUE(
      problems_of(job_with({{"optimizer", zo}, {"parallelism", {{"context", 2}}}})).empty());
  // Pipeline stages combine (each stage over its data-parallel group), with tensor ranks too.
  const auto pp = problems_of(job_with(
      {{"optimizer", zo}, {"parallelism", {{"pipeline", 2}}}, {"gradient_accumulation_steps", 2}}));
  EXPECT_FALSE(contains(pp, "parallelism.pipeline")) << joined(pp);
  const auto ppt = problems_of(job_with({{"optimizer", zo},
                                         {"parallelism", {{"pipeline", 2}, {"tensor", 2}}},
                                         {"gradient_accumulation_steps", 2}}));
  EXPECT_TRUE(ppt.empty()) << joined(ppt);
}

}  // namespace
}  // namespace zerod
