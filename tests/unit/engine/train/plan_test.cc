// The planner against zerod's own memory accounting: for ZeRO stages 0-3 at world sizes 1, 2
// and 4, the model-state and activation bytes it predicts are within 10% of what real runs
// measure; the same for tensor parallelism (T = 2 x DP = 2); and its choices on known cases.
#include "engine/plan/planner.h"

#include <gtest/gtest.h>

#include <mutex>
#include <vector>

#include "engine/config/model_spec.h"
#include "engine/train/memory_preflight.h"
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

// The whole of a rank's tracked memory, not only its model states and activations: the peak of
// every category together (weights, gradients, master, moments, stage-3 gathered units,
// reduction buckets, activations, workspace) against the device + host bytes of the job's own
// plan row (job_plan_row, what the preflight and zerod_train_bench compare with), at every stage
// and world 1 and 2. zerod_train_bench adds the process's start-up resident bytes to compare with
// peak RSS (docs/benchmarks.md, CPU scaling).
TEST(Planner, JobRowMatchesTheTrackedPeakOfAllCategories) {
  testing::TempCorpus corpus("zerod_plan_total_corpus");
  struct Cell {
    int world, stage;
    std::string zero;  // zero_optimization members
  };
  const Cell cells[] = {
      {1, 0, ""},
      {2, 0, ""},
      {2, 1, ""},
      {2, 2, ""},                           // buckets: one per unit size
      {2, 2, R"(, "overlap_comm": true)"},  // buckets: every unit until the step's end
      {2, 2, R"(, "overlap_comm": true, "reduce_bucket_size": 1000)"},  // a few in flight
      {2, 3, ""},  // overlaps; every unit persistent (all under 100000 elements)
      {2, 3, R"(, "stage3_param_persistence_threshold": 0)"},  // in use + prefetched
      {2, 3, R"(, "stage3_param_persistence_threshold": 0, "overlap_comm": false)"},
  };
  for (const Cell& c : cells) {
    const JobConfig cfg = testing::tiny_job(corpus, c.world, c.stage, 1, 1, "", "", 8, c.zero);
    std::mutex mu;
    int64_t peak = 0;
    std::string described;
    testing::run_world(c.world, [&](const RankContext& ctx) {
      Trainer t(cfg, ctx, testing::quiet_trainer());
      t.run();
      if (ctx.rank != 0) return;
      std::lock_guard<std::mutex> lock(mu);
      peak = t.memory().total_peak();
      described = t.memory().describe();
    });
    const Plan plan = make_plan(job_plan_request(cfg, model_spec(cfg.model), 4));
    const PlanRow* row = job_plan_row(plan, cfg);
    ASSERT_NE(row, nullptr);
    EXPECT_EQ(row->stage, c.stage);
    const int64_t planned = row->device + row->host;
    EXPECT_LT(rel(static_cast<double>(planned), static_cast<double>(peak)), 0.02)
        << "world " << c.world << " stage " << c.stage << c.zero << ": planned " << planned
        << " (buffers " << row->buffers << ") tracked peak " << peak << " (" << described << ")";
  }
}

// Tensor parallelism: T = 2 x DP = 2 (world 4, ranks as threads), GPT-2 and a Llama with
// grouped-query attention and an untied head, at every stage, without and with sequence
// parallelism: the per-rank states (ZeRO over DP of the TP-local parameters) and activations
// (one of T ranks) within 10% of what each rank measures (tensor ranks 0 and 1 lay out the same
// sizes).
// Context parallelism: each rank holds seq / C positions and ZeRO partitions over data x
// context; the plan of C=2 x DP=2 matches what the ranks measure.
TEST(Planner, MatchesMeasuredMemoryForContextTwoTimesDataTwo) {
  testing::TempCorpus corpus("zerod_plan_cp_corpus");
  for (const testing::TinyModel& model : {testing::tiny_gpt2(), testing::tiny_llama()}) {
    for (int stage = 0; stage < 4; ++stage) {
      const JobConfig cfg = testing::tiny_job(
          corpus, 4, stage, 1, 1, R"(, "parallelism": {"context": 2, "context_impl": "ring"})", "",
          8, "", model);
      ASSERT_EQ(cfg.data_parallel_size, 2);
      std::mutex mu;
      std::vector<ModelStateBytes> measured(4);
      std::vector<int64_t> acts(4, 0);
      testing::run_world(4, [&](const RankContext& ctx) {
        Trainer t(cfg, ctx, testing::quiet_trainer());
        t.run();
        std::lock_guard<std::mutex> lock(mu);
        measured[static_cast<size_t>(ctx.rank)] = t.engine().measured_bytes();
        acts[static_cast<size_t>(ctx.rank)] = t.memory().peak(MemCategory::kActivations);
      });
      PlanRequest r;
      r.spec = model_spec(cfg.model);
      r.world = 4;
      r.context = 2;
      r.context_impl = "ring";
      r.micro_batch = static_cast<int>(cfg.micro_batch());
      r.seq = cfg.model.seq_len;
      r.compute_bytes = 4;
      r.offload = "none";
      const Plan plan = make_plan(r);
      EXPECT_EQ(plan.data_parallel, 2);
      const PlanRow* row = nullptr;
      for (const auto& p : plan.rows)
        if (p.stage == stage) row = &p;
      ASSERT_NE(row, nullptr) << "stage " << stage;
      for (int rank = 0; rank < 4; ++rank) {
        const ModelStateBytes& m = measured[static_cast<size_t>(rank)];
        const std::string what = std::string(model.name) + " C=2 x DP=2 stage " +
                                 std::to_string(stage) + " rank " + std::to_string(rank);
        const double states = static_cast<double>(row->weights + row->gradients + row->optimizer);
        EXPECT_LT(rel(states, static_cast<double>(m.states())), 0.10)
            << what << ": planned " << states << " measured " << m.states();
        const int64_t a = acts[static_cast<size_t>(rank)];
        EXPECT_LT(rel(static_cast<double>(row->activations), static_cast<double>(a)), 0.10)
            << what << ": activations planned " << row->activations << " measured " << a;
      }
    }
  }
}

// Expert parallelism: each rank stores num_experts / E of the experts, ZeRO shards them over
// DP / E ranks; the plan of E = 2 on 4 ranks matches the model states the ranks measure, at
// every stage, and is below E = 1's plan at stages 0-2 (stage 3 shards every expert 1/DP
// either way).
TEST(Planner, MatchesMeasuredMemoryForExpertParallelism) {
  testing::TempCorpus corpus("zerod_plan_ep_corpus");
  const testing::TinyModel model =
      testing::tiny_moe_gpt2(R"({"num_experts": 4, "top_k": 2, "drop_tokens": false})", 2);
  for (int stage = 0; stage < 4; ++stage) {
    const JobConfig cfg = testing::tiny_job(corpus, 4, stage, 1, 1,
                                            R"(, "parallelism": {"expert": 2})", "", 8, "", model);
    std::mutex mu;
    std::vector<ModelStateBytes> measured(4);
    testing::run_world(4, [&](const RankContext& ctx) {
      Trainer t(cfg, ctx, testing::quiet_trainer());
      t.run();
      std::lock_guard<std::mutex> lock(mu);
      measured[static_cast<size_t>(ctx.rank)] = t.engine().measured_bytes();
    });
    PlanRequest r;
    r.spec = model_spec(cfg.model);
    r.world = 4;
    r.micro_batch = static_cast<int>(cfg.micro_batch());
    r.seq = cfg.model.seq_len;
    r.compute_bytes = 4;
    r.offload = "none";
    auto row_of = [&](const Plan& plan) {
      for (const auto& p : plan.rows)
        if (p.stage == stage) return p;
      ADD_FAILURE() << "no stage " << stage << " row";
      return PlanRow{};
    };
    const PlanRow one = row_of(make_plan(r));
    r.expert = 2;
    const PlanRow row = row_of(make_plan(r));
    const double states = static_cast<double>(row.weights + row.gradients + row.optimizer);
    for (int rank = 0; rank < 4; ++rank) {
      const ModelStateBytes& m = measured[static_cast<size_t>(rank)];
      const std::string what =
          "E=2 stage " + std::to_string(stage) + " rank " + std::to_string(rank);
      EXPECT_LT(rel(states, static_cast<double>(m.states())), 0.02)
          << what << ": planned " << states << " measured " << m.states();
      EXPECT_LT(rel(static_cast<double>(row.weights), static_cast<double>(m.weights)), 0.02)
          << what;
      EXPECT_LT(rel(static_cast<double>(row.gradients), static_cast<double>(m.gradients)), 0.02)
          << what;
    }
    const double one_states = static_cast<double>(one.weights + one.gradients + one.optimizer);
    if (stage < 3) {
      EXPECT_LT(states, 0.95 * one_states) << "stage " << stage;
    } else {
      EXPECT_LT(rel(states, one_states), 0.02) << "stage 3";
    }
  }
  PlanRequest bad;
  bad.spec = model_spec(testing::tiny_job(corpus, 4, 0, 1, 1, "", "", 8, "", model).model);
  bad.world = 4;
  bad.expert = 3;
  EXPECT_THROW(make_plan(bad), InputError);
}

TEST(Planner, MatchesMeasuredMemoryForTensorTwoTimesDataTwo) {
  testing::TempCorpus corpus("zerod_plan_tp_corpus");
  for (const testing::TinyModel& model : {testing::tiny_gpt2(), testing::tiny_llama()}) {
    for (int cell = 0; cell < 8; ++cell) {
      const int stage = cell % 4;
      const bool sp = cell >= 4;
      const JobConfig cfg =
          testing::tiny_job(corpus, 4, stage, 1, 1,
                            std::string(R"(, "parallelism": {"tensor": 2, "sequence_parallel": )") +
                                (sp ? "true" : "false") + "}",
                            "", 8, "", model);
      ASSERT_EQ(cfg.data_parallel_size, 2);
      std::mutex mu;
      std::vector<ModelStateBytes> measured(4);
      std::vector<int64_t> acts(4, 0);
      testing::run_world(4, [&](const RankContext& ctx) {
        Trainer t(cfg, ctx, testing::quiet_trainer());
        t.run();
        std::lock_guard<std::mutex> lock(mu);
        measured[static_cast<size_t>(ctx.rank)] = t.engine().measured_bytes();
        acts[static_cast<size_t>(ctx.rank)] = t.memory().peak(MemCategory::kActivations);
      });
      PlanRequest r;
      r.spec = model_spec(cfg.model);
      r.world = 4;
      r.tensor = 2;
      r.sequence_parallel = sp;
      r.micro_batch = static_cast<int>(cfg.micro_batch());
      r.seq = cfg.model.seq_len;
      r.compute_bytes = 4;  // fp32
      r.offload = "none";
      const Plan plan = make_plan(r);
      EXPECT_EQ(plan.tensor_parallel, 2);
      EXPECT_EQ(plan.data_parallel, 2);
      const PlanRow* row = nullptr;
      for (const auto& p : plan.rows)
        if (p.stage == stage) row = &p;
      ASSERT_NE(row, nullptr) << "stage " << stage;
      for (int rank = 0; rank < 4; ++rank) {
        const ModelStateBytes& m = measured[static_cast<size_t>(rank)];
        const std::string what = std::string(model.name) + " T=2 x DP=2" + (sp ? " SP" : "") +
                                 " stage " + std::to_string(stage) + " rank " +
                                 std::to_string(rank);
        const double states = static_cast<double>(row->weights + row->gradients + row->optimizer);
        EXPECT_LT(rel(states, static_cast<double>(m.states())), 0.10)
            << what << ": planned " << states << " measured " << m.states();
        EXPECT_LT(rel(static_cast<double>(row->weights), static_cast<double>(m.weights)), 0.10)
            << what << ": weights planned " << row->weights << " measured " << m.weights;
        EXPECT_LT(rel(static_cast<double>(row->gradients), static_cast<double>(m.gradients)), 0.10)
            << what << ": gradients planned " << row->gradients << " measured " << m.gradients;
        EXPECT_LT(
            rel(static_cast<double>(row->optimizer), static_cast<double>(m.master + m.moments)),
            0.10)
            << what << ": optimizer planned " << row->optimizer << " measured "
            << m.master + m.moments;
        const int64_t a = acts[static_cast<size_t>(rank)];
        EXPECT_LT(rel(static_cast<double>(row->activations), static_cast<double>(a)), 0.10)
            << what << ": activations planned " << row->activations << " measured " << a;
      }
    }
  }
}

// The planner's tensor-parallel arithmetic on a published shape: the per-rank parameters are
// half the model's at T = 2, ZeRO divides them over DP = world / T, and sequence parallelism
// shrinks the activations further, towards the single-rank activations / T.
TEST(Planner, TensorParallelSplitsParametersAndActivations) {
  PlanRequest r;
  r.spec = model_preset("llama3-8b");
  r.world = 8;
  r.micro_batch = 1;
  r.seq = 4096;
  r.offload = "none";
  const Plan dp8 = make_plan(r);
  r.tensor = 2;
  const Plan tp2 = make_plan(r);
  EXPECT_EQ(tp2.tensor_parallel, 2);
  EXPECT_EQ(tp2.data_parallel, 4);
  EXPECT_EQ(tp2.parameters, dp8.parameters);
  EXPECT_NEAR(static_cast<double>(tp2.padded_parameters),
              static_cast<double>(dp8.padded_parameters) / 2, 0.001 * dp8.padded_parameters);
  // ZeRO-3 per rank: (psi / 2) over 4 ranks = psi over 8 ranks.
  const PlanRow& s3_dp8 = dp8.rows[3];
  const PlanRow& s3_tp2 = tp2.rows[3];
  ASSERT_EQ(s3_dp8.stage, 3);
  ASSERT_EQ(s3_tp2.stage, 3);
  EXPECT_NEAR(static_cast<double>(s3_tp2.weights + s3_tp2.gradients + s3_tp2.optimizer),
              static_cast<double>(s3_dp8.weights + s3_dp8.gradients + s3_dp8.optimizer),
              0.001 * static_cast<double>(s3_dp8.optimizer));
  // Activations: less than half of one rank's are split (the residual stream and norms stay).
  EXPECT_LT(tp2.rows[0].activations, dp8.rows[0].activations);
  EXPECT_GT(tp2.rows[0].activations, dp8.rows[0].activations / 2);
  r.sequence_parallel = true;
  const Plan sp2 = make_plan(r);
  EXPECT_LT(sp2.rows[0].activations, tp2.rows[0].activations);
  EXPECT_NEAR(static_cast<double>(sp2.rows[0].activations),
              static_cast<double>(dp8.rows[0].activations) / 2,
              0.01 * static_cast<double>(dp8.rows[0].activations));
  // T must divide the world and the model's heads.
  r.tensor = 3;
  r.world = 9;
  EXPECT_THROW(make_plan(r), InputError);  // 32 heads
  r.tensor = 2;
  r.world = 6;
  EXPECT_NO_THROW(make_plan(r));
  r.world = 7;
  EXPECT_THROW(make_plan(r), InputError);
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
