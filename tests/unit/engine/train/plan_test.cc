// The planner against zerod's own memory accounting: for ZeRO stages 0-3 at world sizes 1, 2
// and 4, the model-state and activation bytes it predicts are within 10% of what real runs
// measure; and its choices on known cases.
#include "engine/plan/planner.h"

#include <gtest/gtest.h>

#include <mutex>

#include "engine/config/model_spec.h"
#include "train_test_util.h"

namespace zerod {
namespace {

double rel(double a, double b) {
  return std::abs(a - b) / std::max(1.0, std::abs(b));
}

TEST(Planner, MatchesMeasuredMemoryForEveryStageAndWorldSize) {
  testing::TempCorpus corpus("zerod_plan_corpus");
  for (int world : {1, 2, 4}) {
    for (int stage : {0, 1, 2, 3}) {
      const JobConfig cfg = testing::tiny_job(corpus, world, stage, 1, 1);
      std::mutex mu;
      ModelStateBytes measured;
      int64_t acts = 0;
      testing::run_world(world, [&](const RankContext& ctx) {
        Trainer t(cfg, ctx, testing::quiet_trainer());
        t.run();
        if (ctx.rank != 0) return;
        std::lock_guard<std::mutex> lock(mu);
        measured = t.engine().measured_bytes();
        acts = t.memory().peak(MemCategory::kActivations);
      });
      PlanRequest r;
      r.spec = model_spec(cfg.model);
      r.world = world;
      r.micro_batch = static_cast<int>(cfg.micro_batch());
      r.seq = cfg.model.seq_len;
      r.compute_bytes = 4;  // fp32
      r.offload = "none";
      const Plan plan = make_plan(r);
      const PlanRow* row = nullptr;
      for (const auto& p : plan.rows)
        if (p.stage == (world == 1 ? 0 : stage)) row = &p;
      ASSERT_NE(row, nullptr);
      const std::string what = "world " + std::to_string(world) + " stage " + std::to_string(stage);
      const double states = static_cast<double>(row->weights + row->gradients + row->optimizer);
      EXPECT_LT(rel(states, static_cast<double>(measured.states())), 0.10)
          << what << ": planned " << states << " measured " << measured.states();
      EXPECT_LT(rel(static_cast<double>(row->weights), static_cast<double>(measured.weights)), 0.10)
          << what;
      EXPECT_LT(rel(static_cast<double>(row->gradients), static_cast<double>(measured.gradients)),
                0.10)
          << what;
      EXPECT_LT(rel(static_cast<double>(row->optimizer),
                    static_cast<double>(measured.master + measured.moments)),
                0.10)
          << what;
      EXPECT_LT(rel(static_cast<double>(row->activations), static_cast<double>(acts)), 0.10)
          << what << ": planned " << row->activations << " measured " << acts;
    }
  }
}

TEST(Planner, RecommendsTheFastestChoiceThatFits) {
  PlanRequest r;
  r.spec = model_preset("gpt2-1.5b");
  ASSERT_TRUE(r.spec);
  r.world = 8;
  r.micro_batch = 4;
  r.activation_checkpointing = true;
  r.device_bytes = parse_bytes("80GiB", "--gpu-mem");
  Plan p = make_plan(r);
  EXPECT_NEAR(static_cast<double>(p.parameters), 1.558e9, 0.01e9);
  ASSERT_GE(p.recommended, 0);
  EXPECT_EQ(p.rows[static_cast<size_t>(p.recommended)].stage, 0);  // 1.5B fits DDP on 80 GiB
  // 16 bytes per parameter of model states at stage 0: ~23 GiB.
  EXPECT_NEAR(static_cast<double>(p.rows[0].weights + p.rows[0].gradients + p.rows[0].optimizer),
              16.0 * static_cast<double>(p.padded_parameters), 1.0);
  // 16 GiB devices: stage 0 does not fit any more; a sharded stage does.
  r.device_bytes = parse_bytes("16GiB", "--gpu-mem");
  p = make_plan(r);
  ASSERT_GE(p.recommended, 0);
  EXPECT_FALSE(p.rows[0].fits);
  EXPECT_GE(p.rows[static_cast<size_t>(p.recommended)].stage, 1);
  // One 8 GiB device: only offloading fits (host memory unchecked).
  r.world = 1;
  r.device_bytes = parse_bytes("8GiB", "--gpu-mem");
  p = make_plan(r);
  ASSERT_GE(p.recommended, 0);
  EXPECT_NE(p.rows[static_cast<size_t>(p.recommended)].offload_optimizer, "none");
  // ... and with too little host memory for the CPU choices, NVMe.
  r.host_bytes = parse_bytes("16GiB", "--cpu-mem");
  p = make_plan(r);
  ASSERT_GE(p.recommended, 0);
  EXPECT_EQ(p.rows[static_cast<size_t>(p.recommended)].offload_optimizer, "nvme");
  // Nothing fits a 100 MiB device.
  r.device_bytes = parse_bytes("100MiB", "--gpu-mem");
  EXPECT_EQ(make_plan(r).recommended, -1);
  EXPECT_THROW(parse_bytes("80 parsecs", "--gpu-mem"), InputError);
  EXPECT_EQ(parse_bytes("1.5GB", "x"), 1500000000);
}

TEST(Plan, LlamaPresetsHaveThePublishedParameterCounts) {
  EXPECT_EQ(model_preset("llama3-8b")->num_parameters(), 8030261248);
  EXPECT_EQ(model_preset("llama2-7b")->num_parameters(), 6738415616);
  EXPECT_EQ(model_preset("mistral-7b")->num_parameters(), 7241732096);
  EXPECT_EQ(model_preset("qwen2-0.5b")->num_parameters(), 494032768);
  EXPECT_EQ(model_preset("llama3-70b")->num_parameters(), 70553706496);
  EXPECT_EQ(model_preset("qwen2-7b")->num_parameters(), 7615616512);
  EXPECT_FALSE(model_preset("llama4"));
  PlanRequest r;
  r.spec = model_preset("llama3-8b");
  r.world = 8;
  r.micro_batch = 1;
  r.seq = 8192;
  r.activation_checkpointing = true;
  r.device_bytes = int64_t{80} << 30;
  const Plan plan = make_plan(r);
  EXPECT_EQ(plan.parameters, 8030261248);
  ASSERT_GE(plan.recommended, 0);
}

}  // namespace
}  // namespace zerod
