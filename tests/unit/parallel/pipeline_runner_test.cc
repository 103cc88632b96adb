// Pipeline parallelism applied to the single-device models from outside: P ranks (threads of this
// process, Gloo over 127.0.0.1) each build the model of their stage (a LayerRange from the
// partition) with activation slots for what the schedule keeps live, take their units of the
// single-rank weights, and run their schedule's actions with the PipelineRunner. Over M
// micro-batches the sum of the last stage's losses and every stage's accumulated gradients must
// equal the single-rank model's (a tied embedding's gradient is the first stage's plus the last
// stage's copy), for GPipe, 1F1B and zero-bubble (the split backward: Bi, then W later), P = 2 and
// 4, GPT-2 and the Llama family, with and without activation checkpointing; the evaluation pass
// (forward only) gives the single-rank loss too.
#include <gtest/gtest.h>

#include <cstdlib>

#include <cmath>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "../comm/comm_test_util.h"
#include "core/memory.h"
#include "model/model.h"
#include "model_test_util.h"
#include "parallel/pipeline/partition.h"
#include "parallel/pipeline/runner.h"
#include "parallel/pipeline/schedule.h"

namespace zerod {
namespace {

using pipeline::ScheduleKind;
using test::Batch;
using test::expect_close;
using test::global_weights;
using test::random_batch;
using test::States;

struct Case {
  ModelSpec spec;
  int stages;
  ScheduleKind schedule;
  int micro_batches;
  bool ckpt = false;
  int virtual_stages = 1;
  const char* prefetch = nullptr;  // ZEROD_PIPELINE_PREFETCH for the run (null: unset, 2)
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << model_arch_name(c.spec.arch) << " P=" << c.stages << " "
      << pipeline::schedule_name(c.schedule) << " M=" << c.micro_batches
      << (c.ckpt ? " checkpointing" : "") << " V=" << c.virtual_stages
      << (c.prefetch ? std::string(" prefetch=") + c.prefetch : "");
}

ModelSpec layers(ModelSpec s, int n) {
  s.n_layer = n;
  return s;
}

class PipelineRunnerModel : public testing::TestWithParam<Case> {};

TEST_P(PipelineRunnerModel, LossesAndGradientsEqualTheSingleRankModel) {
  const Case c = GetParam();
  // Receives posted ahead (2 by default), at their actions (0) or many ahead: the same results.
  if (c.prefetch != nullptr) {
    ASSERT_EQ(setenv("ZEROD_PIPELINE_PREFETCH", c.prefetch, 1), 0);
  } else {
    unsetenv("ZEROD_PIPELINE_PREFETCH");
  }
  struct Unset {
    ~Unset() { unsetenv("ZEROD_PIPELINE_PREFETCH"); }
  } unset_after;
  const int B = 2, T = 9, P = c.stages, M = c.micro_batches, V = c.virtual_stages;
  std::vector<Batch> batches;
  for (int m = 0; m < M; ++m)
    batches.push_back(random_batch(B, T, c.spec.vocab_size, 3 + static_cast<uint64_t>(m)));
  std::vector<pipeline::MicroBatch> mbs;
  for (const Batch& b : batches) mbs.push_back({b.inputs.data(), b.targets.data()});

  // The single-rank reference: every micro-batch's loss and the accumulated gradients.
  const ParamLayout global(c.spec);
  const auto gw = global_weights(global);
  double want_loss = 0, want_eval = 0;
  std::vector<std::vector<float>> want_grads;
  {
    auto be = make_cpu_backend(DType::kF32);
    auto model = make_model(c.spec, *be, B, T, c.ckpt, nullptr);
    States st(gw);
    for (const Batch& b : batches)
      want_loss += model->forward_backward(b.inputs.data(), b.targets.data(), st, st, 1.0f);
    for (const Batch& b : batches)
      want_eval += model->forward(b.inputs.data(), b.targets.data(), st);
    want_grads = st.grads;
  }

  pipeline::PartitionRequest split;
  split.layers = c.spec.n_layer;
  split.stages = P * V;
  const std::vector<int> first = pipeline::stage_first_layers(pipeline::partition_layers(split));
  const pipeline::Schedule schedule = pipeline::make_schedule(c.schedule, P, M, V);
  test::World world = test::make_world(P);
  std::vector<double> losses(static_cast<size_t>(P)), evals(static_cast<size_t>(P));
  std::vector<std::vector<std::vector<float>>> grads(static_cast<size_t>(P));
  std::vector<std::vector<int>> global_units(static_cast<size_t>(P));
  std::vector<int> slots(static_cast<size_t>(P));
  test::run_ranks(P, [&](int r) {
    auto be = make_cpu_backend(DType::kF32);
    const auto& actions = schedule[static_cast<size_t>(r)];
    slots[static_cast<size_t>(r)] = pipeline::slots_needed(actions);
    // The rank's stages (chunk ch: global stage ch x P + r), a model each, and their layout.
    std::vector<LayerRange> ranges;
    for (int ch = 0; ch < V; ++ch) {
      const size_t s = static_cast<size_t>(ch * P + r);
      ranges.push_back(LayerRange{first[s], first[s + 1]});
    }
    const LayerRange stage = ranges[0];
    MemoryTracker tracker;
    std::vector<std::unique_ptr<Model>> models;
    std::vector<Model*> chunk_models;
    for (int ch = 0; ch < V; ++ch) {
      models.push_back(make_model(c.spec, *be, B, T, c.ckpt, &tracker, {}, {},
                                  ranges[static_cast<size_t>(ch)],
                                  pipeline::slots_needed(actions, ch)));
      chunk_models.push_back(models.back().get());
    }
    const int64_t built = tracker.current(MemCategory::kActivations);
    const ParamLayout local(c.spec, 16, {}, ranges);
    std::vector<std::vector<float>> w;
    for (int u = 0; u < local.num_units(); ++u) {
      w.push_back(gw[static_cast<size_t>(local.global_unit(u))]);
      global_units[static_cast<size_t>(r)].push_back(local.global_unit(u));
    }
    States st(std::move(w));
    Communicator& comm = *world.comms[static_cast<size_t>(r)];
    pipeline::PipelineRunner runner(actions, chunk_models, local, *be, &comm, nullptr);
    // Each micro-batch's backwards (one per chunk) come in micro-batch order per chunk.
    std::vector<int> backwards(static_cast<size_t>(M), 0);
    int done = 0;
    losses[static_cast<size_t>(r)] = runner.run(mbs, st, st, 1.0f, [&](int m) {
      if (V == 1) EXPECT_EQ(m, done) << "backwards in micro-batch order";
      ++backwards.at(static_cast<size_t>(m));
      ++done;
    });
    for (int m = 0; m < M; ++m) EXPECT_EQ(backwards[static_cast<size_t>(m)], V) << "mb " << m;
    // A split backward's copies: the formula per micro-batch between Bi and W, times the most
    // such at once (allocated on first use, then reused).
    const int pending = pipeline::weight_passes_pending(actions);
    EXPECT_EQ(pending > 0, c.schedule == ScheduleKind::kZeroBubbleH1 && P > 1);
    EXPECT_EQ(tracker.peak(MemCategory::kActivations),
              built + pending * split_backward_bytes(c.spec, B, T, 4, 1, stage))
        << "rank " << r;
    grads[static_cast<size_t>(r)] = st.grads;
    evals[static_cast<size_t>(r)] = runner.forward_only(mbs, st);
    // The timeline has every action, in order, with non-negative durations.
    ASSERT_EQ(runner.timeline().size(), actions.size());
    for (const pipeline::TimedAction& t : runner.timeline()) EXPECT_GE(t.end, t.begin);
  });

  EXPECT_NEAR(losses.back(), want_loss, 1e-5 * std::fabs(want_loss));
  EXPECT_NEAR(evals.back(), want_eval, 1e-5 * std::fabs(want_eval));
  for (int r = 0; r + 1 < P; ++r) {
    EXPECT_EQ(losses[static_cast<size_t>(r)], 0.0) << "stage " << r << " has no loss";
    EXPECT_EQ(evals[static_cast<size_t>(r)], 0.0) << "stage " << r << " has no loss";
  }
  // 1F1B keeps P - r micro-batches live on rank r (at most M); GPipe all M; zero-bubble
  // (live until W, which rank r runs r backwards late) P on every rank.
  for (int r = 0; r < P && V == 1; ++r) {
    const int want = c.schedule == ScheduleKind::kGPipe          ? M
                     : c.schedule == ScheduleKind::kZeroBubbleH1 ? std::min(M, P)
                                                                 : std::min(M, P - r);
    EXPECT_EQ(slots[static_cast<size_t>(r)], want) << "rank " << r;
  }
  // Every unit's gradient is held by exactly one stage, except the tied embedding (first + last).
  std::vector<std::vector<float>> got(want_grads.size());
  std::vector<int> holders(want_grads.size(), 0);
  for (int r = 0; r < P; ++r) {
    for (size_t u = 0; u < global_units[static_cast<size_t>(r)].size(); ++u) {
      const size_t g = static_cast<size_t>(global_units[static_cast<size_t>(r)][u]);
      const std::vector<float>& x = grads[static_cast<size_t>(r)][u];
      if (got[g].empty()) got[g].assign(x.size(), 0.0f);
      for (size_t i = 0; i < x.size(); ++i) got[g][i] += x[i];
      ++holders[g];
    }
  }
  for (size_t g = 0; g < want_grads.size(); ++g) {
    const bool tied_copy = g == 0 && c.spec.tied() && P > 1;
    EXPECT_EQ(holders[g], tied_copy ? 2 : 1) << "unit " << global.unit(static_cast<int>(g)).name;
    expect_close(got[g], want_grads[g], 2e-6, "unit " + global.unit(static_cast<int>(g)).name);
  }
}

std::string case_name(const testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return std::string(model_arch_name(c.spec.arch)) + "_P" + std::to_string(c.stages) + "_" +
         pipeline::schedule_name(c.schedule) + "_M" + std::to_string(c.micro_batches) +
         (c.virtual_stages > 1 ? "_V" + std::to_string(c.virtual_stages) : "") +
         (c.ckpt ? "_checkpointing" : "") +
         (c.prefetch ? std::string("_prefetch") + c.prefetch : "");
}

INSTANTIATE_TEST_SUITE_P(
    Schedules, PipelineRunnerModel,
    testing::Values(
        Case{test::tiny_gpt2(), 2, ScheduleKind::kGPipe, 3},
        Case{test::tiny_gpt2(), 2, ScheduleKind::kOneFOneB, 4},
        Case{layers(test::tiny_gpt2(), 5), 4, ScheduleKind::kOneFOneB, 6},
        Case{layers(test::tiny_gpt2(), 4), 4, ScheduleKind::kGPipe, 4, true},
        Case{test::tiny_llama(ModelArch::kLlama), 2, ScheduleKind::kOneFOneB, 3},
        Case{layers(test::tiny_llama(ModelArch::kQwen2), 4), 4, ScheduleKind::kOneFOneB, 5, true},
        Case{test::tiny_llama(ModelArch::kMistral), 1, ScheduleKind::kOneFOneB, 2},
        Case{test::tiny_gpt2(), 2, ScheduleKind::kZeroBubbleH1, 4},
        Case{layers(test::tiny_gpt2(), 5), 4, ScheduleKind::kZeroBubbleH1, 6, true},
        Case{test::tiny_llama(ModelArch::kLlama), 2, ScheduleKind::kZeroBubbleH1, 3, true},
        Case{layers(test::tiny_llama(ModelArch::kQwen2), 4), 4, ScheduleKind::kZeroBubbleH1, 5},
        Case{test::tiny_gpt2(), 1, ScheduleKind::kZeroBubbleH1, 2},
        Case{layers(test::tiny_gpt2(), 4), 2, ScheduleKind::kInterleaved1F1B, 4, false, 2},
        Case{layers(test::tiny_gpt2(), 6), 2, ScheduleKind::kInterleaved1F1B, 6, true, 3},
        Case{layers(test::tiny_llama(ModelArch::kLlama), 8), 4, ScheduleKind::kInterleaved1F1B, 8,
             false, 2},
        Case{layers(test::tiny_llama(ModelArch::kQwen2), 4), 2, ScheduleKind::kInterleaved1F1B, 2,
             true, 2},
        Case{layers(test::tiny_gpt2(), 4), 2, ScheduleKind::kInterleaved1F1B, 4, false, 2, "0"},
        Case{layers(test::tiny_gpt2(), 5), 4, ScheduleKind::kZeroBubbleH1, 6, false, 1, "16"}),
    case_name);

TEST(PipelineRunner, PrefetchSettingIsParsedOrRefused) {
  EXPECT_EQ(pipeline::parse_pipeline_prefetch(nullptr), 2u);
  EXPECT_EQ(pipeline::parse_pipeline_prefetch(""), 2u);
  EXPECT_EQ(pipeline::parse_pipeline_prefetch("0"), 0u);
  EXPECT_EQ(pipeline::parse_pipeline_prefetch("16"), 16u);
  for (const char* bad : {"-1", "17", "2x", "many"}) {
    try {
      pipeline::parse_pipeline_prefetch(bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("ZEROD_PIPELINE_PREFETCH"), std::string::npos);
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos);
    }
  }
}

// A stage's layout holds its units only, with global names and the single-rank initialisation;
// the last stage of a tied model holds the embedding's copy, which is left out of the norm.
TEST(PipelineStageLayout, UnitsNamesAndInitialisationOfEachStage) {
  const ModelSpec s = layers(test::tiny_gpt2(), 4);
  const ParamLayout whole(s);
  const ParamLayout mid(s, 16, {}, LayerRange{1, 3});
  ASSERT_EQ(mid.num_units(), 2);
  EXPECT_EQ(mid.unit(0).name, "h.1");
  EXPECT_EQ(mid.global_unit(1), whole.block_unit(2));
  EXPECT_EQ(mid.block_unit(2), 1);
  EXPECT_EQ(mid.embedding_unit(), -1);
  EXPECT_EQ(mid.final_unit(), -1);
  const ParamLayout last(s, 16, {}, LayerRange{3, 4});
  ASSERT_EQ(last.num_units(), 3);  // embedding copy, h.3, ln_f
  EXPECT_EQ(last.embedding_unit(), 0);
  EXPECT_EQ(last.tied_copy_unit(), 0);
  EXPECT_EQ(last.final_unit(), 2);
  EXPECT_FALSE(last.counted_in_norm(0, last.unit(0).tensors[0]));
  EXPECT_TRUE(last.counted_in_norm(1, last.unit(1).tensors[0]));
  const ParamLayout first(s, 16, {}, LayerRange{0, 1});
  EXPECT_EQ(first.tied_copy_unit(), -1);
  EXPECT_TRUE(first.counted_in_norm(0, first.unit(0).tensors[0]));
  for (const ParamLayout* l : {&mid, &last, &first}) {
    for (int u = 0; u < l->num_units(); ++u) {
      const int g = l->global_unit(u);
      const int64_t n = l->unit(u).numel;
      ASSERT_EQ(n, whole.unit(g).numel);
      std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
      l->init_range(u, a.data(), 0, n, 5);
      whole.init_range(g, b.data(), 0, n, 5);
      EXPECT_EQ(a, b) << l->unit(u).name;
    }
  }
  // An untied Llama's last stage holds no embedding.
  const ParamLayout llama_last(layers(test::tiny_llama(ModelArch::kLlama), 4), 16, {},
                               LayerRange{2, 4});
  EXPECT_EQ(llama_last.embedding_unit(), -1);
  EXPECT_EQ(llama_last.num_units(), 3);
  EXPECT_THROW(ParamLayout(s, 16, {}, LayerRange{3, 3}), Error);
  EXPECT_THROW(ParamLayout(s, 16, {}, LayerRange{2, 5}), Error);
}

// A stage's model allocates what model_activation_bytes says for its layers and slots (the whole
// model's formula at one slot), and a middle stage holds no logits.
TEST(PipelineStageModel, ActivationBytesAreTheFormulasForEveryStageAndSlotCount) {
  for (const ModelSpec& s :
       {layers(test::tiny_gpt2(), 4), layers(test::tiny_llama(ModelArch::kLlama), 4)}) {
    for (bool ckpt : {false, true}) {
      for (const LayerRange stage :
           {LayerRange{}, LayerRange{0, 1}, LayerRange{1, 3}, LayerRange{3, 4}}) {
        for (int slots : {1, 3}) {
          auto be = make_cpu_backend(DType::kF32);
          MemoryTracker tracker;
          auto model = make_model(s, *be, 2, 9, ckpt, &tracker, {}, {}, stage, slots);
          EXPECT_EQ(tracker.current(MemCategory::kActivations),
                    model_activation_bytes(s, 2, 9, ckpt, 4, 1, false, 1, stage, slots))
              << model_arch_name(s.arch) << " layers [" << stage.begin << ", " << stage.end
              << ") slots " << slots << (ckpt ? " checkpointing" : "");
        }
      }
    }
  }
  const ModelSpec s = layers(test::tiny_gpt2(), 4);
  // The middle stage at 3 slots: three residual streams of 3 positions' worth, no logits.
  EXPECT_LT(model_activation_bytes(s, 2, 9, false, 4, 1, false, 1, LayerRange{1, 3}, 3),
            model_activation_bytes(s, 2, 9, false, 4, 1, false, 1, LayerRange{3, 4}, 3));
}

// The runner refuses what it cannot execute yet, naming it.
TEST(PipelineRunner, RefusesChunks) {
  const ModelSpec s = test::tiny_gpt2();
  auto be = make_cpu_backend(DType::kF32);
  auto model = make_model(s, *be, 2, 9, false, nullptr);
  const auto il = pipeline::make_schedule(ScheduleKind::kInterleaved1F1B, 1, 2, 2);
  try {
    pipeline::PipelineRunner runner(il[0], *model, *be, nullptr, nullptr);
    FAIL() << "chunks accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("virtual stage"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace zerod
