// The batch triangle: train_batch_size = micro x accumulation x world size, derived and checked
// the way DeepSpeedConfig does it (_set_batch_related_parameters, then _batch_assertion).
#include <gtest/gtest.h>

#include <optional>

#include "config_test_util.h"

namespace zerod {
namespace {

using testing_config::contains;
using testing_config::joined;

struct TriangleCase {
  const char* name;
  std::optional<int64_t> train, micro, accum;
  int world;
  // Expected result: all three sides, or an error containing `error`.
  int64_t want_train, want_micro, want_accum;
  const char* error;
};

JobConfig job_with_triangle(const TriangleCase& c) {
  JobConfig cfg;
  cfg.train_batch_size = c.train;
  cfg.train_micro_batch_size_per_gpu = c.micro;
  cfg.gradient_accumulation_steps = c.accum;
  return cfg;
}

class BatchTriangle : public ::testing::TestWithParam<TriangleCase> {};

TEST_P(BatchTriangle, ResolvesLikeDeepSpeed) {
  const TriangleCase& c = GetParam();
  JobConfig cfg = job_with_triangle(c);
  if (c.error == nullptr) {
    ASSERT_NO_THROW(resolve_job(cfg, c.world));
    EXPECT_EQ(cfg.world_size, c.world);
    EXPECT_EQ(cfg.global_batch(), c.want_train);
    EXPECT_EQ(cfg.micro_batch(), c.want_micro);
    EXPECT_EQ(cfg.grad_accum(), c.want_accum);
    // The identity holds for every accepted case.
    EXPECT_EQ(cfg.global_batch(), cfg.micro_batch() * cfg.grad_accum() * c.world);
  } else {
    try {
      resolve_job(cfg, c.world);
      FAIL() << "accepted; expected an error containing: " << c.error;
    } catch (const ConfigError& e) {
      EXPECT_TRUE(contains(e.problems(), c.error)) << joined(e.problems());
      EXPECT_EQ(e.exit_code(), 2);
    }
  }
}

constexpr std::nullopt_t kNone = std::nullopt;

INSTANTIATE_TEST_SUITE_P(
    Table, BatchTriangle,
    ::testing::Values(
        // The four required cases (world size 2; train/micro/accumulation all given).
        TriangleCase{"required_32_16_1", 32, 16, 1, 2, 32, 16, 1, nullptr},
        TriangleCase{"required_32_8_2", 32, 8, 2, 2, 32, 8, 2, nullptr},
        TriangleCase{"required_33_17_2", 33, 17, 2, 2, 0, 0, 0,
                     "train_batch_size 33 != train_micro_batch_size_per_gpu 17 x "
                     "gradient_accumulation_steps 2 x world size 2"},
        TriangleCase{"required_32_18_1", 32, 18, 1, 2, 0, 0, 0,
                     "train_batch_size 32 != train_micro_batch_size_per_gpu 18 x "
                     "gradient_accumulation_steps 1 x world size 2"},
        // train + micro -> accumulation = train // micro // world.
        TriangleCase{"derive_accum", 32, 8, kNone, 2, 32, 8, 2, nullptr},
        // 34 // 8 // 2 = 2, and 8 x 2 x 2 = 32 != 34.
        TriangleCase{"derive_accum_inexact", 34, 8, kNone, 2, 0, 0, 0,
                     "train_batch_size 34 != train_micro_batch_size_per_gpu 8 x "
                     "gradient_accumulation_steps 2 x world size 2"},
        // 33 // 17 // 2 = 0.
        TriangleCase{"derive_accum_zero", 33, 17, kNone, 2, 0, 0, 0,
                     "gradient_accumulation_steps: 0 must be greater than 0"},
        // train + accumulation -> micro = train // world // accumulation.
        TriangleCase{"derive_micro", 32, kNone, 4, 2, 32, 4, 4, nullptr},
        // 30 // 4 // 2 = 3, 3 x 2 x 4 = 24 != 30.
        TriangleCase{"derive_micro_inexact", 30, kNone, 2, 4, 0, 0, 0,
                     "train_batch_size 30 != train_micro_batch_size_per_gpu 3 x "
                     "gradient_accumulation_steps 2 x world size 4"},
        // micro + accumulation -> train = micro x accumulation x world.
        TriangleCase{"derive_train", kNone, 4, 3, 2, 24, 4, 3, nullptr},
        // train alone -> accumulation 1, micro = train // world.
        TriangleCase{"train_only", 32, kNone, kNone, 2, 32, 16, 1, nullptr},
        TriangleCase{"train_only_inexact", 33, kNone, kNone, 2, 0, 0, 0,
                     "train_batch_size 33 != train_micro_batch_size_per_gpu 16 x "
                     "gradient_accumulation_steps 1 x world size 2"},
        TriangleCase{"train_only_too_small", 1, kNone, kNone, 2, 0, 0, 0,
                     "train_micro_batch_size_per_gpu: 0 must be greater than 0"},
        // micro alone -> accumulation 1, train = micro x world.
        TriangleCase{"micro_only", kNone, 5, kNone, 3, 15, 5, 1, nullptr},
        // Neither train nor micro.
        TriangleCase{"accum_only", kNone, kNone, 4, 2, 0, 0, 0,
                     "train_batch_size or train_micro_batch_size_per_gpu is required"},
        TriangleCase{"none", kNone, kNone, kNone, 1, 0, 0, 0,
                     "train_batch_size or train_micro_batch_size_per_gpu is required"},
        // Values a JobConfig built in code may hold (the parser rejects them earlier).
        TriangleCase{"zero_train", 0, 4, 1, 1, 0, 0, 0,
                     "train_batch_size: 0 must be greater than 0"},
        TriangleCase{"negative_micro", 8, -4, 1, 1, 0, 0, 0,
                     "train_micro_batch_size_per_gpu: -4 must be greater than 0"},
        TriangleCase{"world_one", 12, 3, 4, 1, 12, 3, 4, nullptr}),
    [](const ::testing::TestParamInfo<TriangleCase>& info) { return info.param.name; });

TEST(BatchTriangleParse, ZeroAndNegativeSizesInAFileAreRangeErrors) {
  using testing_config::job_with;
  using testing_config::problems_of;
  EXPECT_EQ(
      problems_of(job_with({{"train_batch_size", 0}})),
      std::vector<std::string>{"train_batch_size: 0 is out of range (allowed: 1 to 2147483647)"});
  EXPECT_EQ(problems_of(job_with({{"gradient_accumulation_steps", -2}})),
            std::vector<std::string>{
                "gradient_accumulation_steps: -2 is out of range (allowed: 1 to 2147483647)"});
}

TEST(BatchTriangleParse, FileValuesFlowIntoTheTriangle) {
  // 3.2e1 is a JSON float with an integral value: accepted as 32.
  ParsedJob job = testing_config::parse(testing_config::job_with(
      {{"train_batch_size", 3.2e1}, {"train_micro_batch_size_per_gpu", 8}}));
  EXPECT_FALSE(job.config.gradient_accumulation_steps.has_value());  // not derived before resolve
  resolve_job(job.config, 2);
  EXPECT_EQ(job.config.grad_accum(), 2);
  EXPECT_EQ(job.config.global_batch(), 32);
}

TEST(BatchTriangleParse, ResolveIsIdempotentAndLeavesConfigUntouchedOnError) {
  JobConfig cfg;
  cfg.train_batch_size = 32;
  resolve_job(cfg, 4);
  const JobConfig once = cfg;
  resolve_job(cfg, 4);
  EXPECT_EQ(cfg, once);

  JobConfig bad;
  bad.train_batch_size = 33;
  bad.train_micro_batch_size_per_gpu = 17;
  const JobConfig before = bad;
  EXPECT_THROW(resolve_job(bad, 2), ConfigError);
  EXPECT_EQ(bad, before);
}

TEST(BatchTriangleParse, WorldSizeMustBePositive) {
  JobConfig cfg;
  cfg.train_micro_batch_size_per_gpu = 1;
  EXPECT_THROW(resolve_job(cfg, 0), ConfigError);
}

}  // namespace
}  // namespace zerod
