// The tensor group's communication volume against Megatron's formula (no sequence parallelism),
// read from the collective log of the tensor group's communicator while the trainer runs (ranks
// as threads, Gloo over 127.0.0.1), for GPT-2 and a Llama with grouped-query attention and an
// untied head; and the comms_logger's per-communicator report.
//
// Per micro-batch of N = micro_batch x seq_len tokens, C wide, L layers, the tensor group
// all-reduces (parallel/tp_exchange.h), in the compute dtype (fp32 here: 4 bytes):
//   forward   the embedding (N C) and, per layer, the attention and MLP outputs (2 N C)
//   backward  per layer the attention and MLP input gradients (2 N C), the head's (N C)
// plus the vocabulary-parallel cross-entropy's statistics: the maximum, the target logit and
// the sum of exponentials, each an all-reduce of N fp32; and once per step the gradient norm's
// partial sum of squares (one fp64) over the model-parallel group (tensor x context: the tensor
// group's communicator when context is 1). Validation is off (eval_interval 0, set explicitly):
// an evaluation pass would add forward-only volume.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "comm/collective_log.h"
#include "core/log.h"
#include "engine/config/model_spec.h"
#include "train_test_util.h"

namespace zerod {
namespace {

using testing::TempCorpus;
using testing::TinyModel;

// What the formula above says the tensor group moves.
struct Volume {
  int64_t calls = 0, bytes = 0;
};

Volume per_micro_batch(const ModelSpec& s, int64_t N) {
  const int64_t C = s.n_embd, L = s.n_layer;
  const int64_t forward = N * C + L * 2 * N * C;   // embedding; attention out, MLP out
  const int64_t backward = L * 2 * N * C + N * C;  // attention in, MLP in; head in
  const int64_t loss = 3 * N;                      // max, target logit, sum of exponentials
  Volume v;
  v.calls = (1 + 2 * L) + (2 * L + 1) + 3;
  v.bytes = (forward + backward) * 4 /* fp32 compute */ + loss * 4 /* fp32 statistics */;
  return v;
}

Volume per_step(const JobConfig& cfg) {
  const ModelSpec s = model_spec(cfg.model);
  const int64_t N = cfg.micro_batch() * int64_t{cfg.model.seq_len};
  const Volume m = per_micro_batch(s, N);
  Volume v;
  v.calls = cfg.grad_accum() * m.calls + 1;  // + the gradient norm
  v.bytes = cfg.grad_accum() * m.bytes + 8;  // (one fp64)
  return v;
}

class TensorParallelComms : public ::testing::TestWithParam<TinyModel> {
 protected:
  static void SetUpTestSuite() { corpus_ = new TempCorpus("zerod_tp_comms"); }
  static void TearDownTestSuite() {
    delete corpus_;
    corpus_ = nullptr;
  }
  // T = 2 at `world` ranks, ZeRO `stage`, accumulation 2, `steps` steps, 8 sequences a step, no
  // validation.
  JobConfig job(int world, int stage, int steps, const std::string& extra = "") const {
    return testing::tiny_job(*corpus_, world, stage, /*accum=*/2, steps,
                             R"(, "parallelism": {"tensor": 2})" + extra, R"(, "eval_interval": 0)",
                             8, "", GetParam());
  }
  static TempCorpus* corpus_;
};

TempCorpus* TensorParallelComms::corpus_ = nullptr;

// World 2, T = 2: the tensor group is the whole world, so its communicator is the world's
// (process_groups.h, rule 1) and also carries the trainer's own per-step collectives: the mean
// loss (one fp64, in the step) and the step boundary's control flags (3 x int32, after it). The
// difference of the log's totals between consecutive steps is one step of each, exactly.
TEST_P(TensorParallelComms, TensorGroupOfTheWholeWorldMovesTheFormulaEachStep) {
  constexpr int kSteps = 4;
  const JobConfig cfg = job(2, /*stage=*/1, kSteps);
  ASSERT_EQ(cfg.micro_batch(), 4);  // 8 sequences = 4 x accumulation 2 x data-parallel 1
  std::mutex mu;
  std::vector<CollectiveTotals> at_step;            // rank 0: all_reduce totals after each step
  std::vector<std::map<std::string, int64_t>> ops;  // rank 0: calls per kind after each step
  bool is_world = false;
  testing::run_world(2, [&](const RankContext& ctx) {
    TrainerOptions o = testing::quiet_trainer();
    Trainer* tp = nullptr;
    o.on_step = [&](const StepMetrics&) {
      if (ctx.rank != 0) return;
      const CollectiveLog* log = tp->groups().tensor().comm().collective_log();
      ASSERT_NE(log, nullptr);
      std::lock_guard<std::mutex> lock(mu);
      const auto totals = log->totals();
      at_step.push_back(totals.count("all_reduce") ? totals.at("all_reduce") : CollectiveTotals{});
      std::map<std::string, int64_t> calls;
      for (const auto& [op, t] : totals) calls[op] = t.calls;
      ops.push_back(calls);
    };
    Trainer t(cfg, ctx, o);
    tp = &t;
    if (ctx.rank == 0) {
      std::lock_guard<std::mutex> lock(mu);
      is_world = t.groups().tensor().is_world() && t.groups().tensor().size() == 2;
    }
    t.run();
  });
  ASSERT_TRUE(is_world);
  ASSERT_EQ(at_step.size(), static_cast<size_t>(kSteps));
  const Volume v = per_step(cfg);
  const int64_t world_calls = 2, world_bytes = 8 /* mean loss */ + 12 /* control flags */;
  for (size_t k = 1; k < at_step.size(); ++k) {
    EXPECT_EQ(at_step[k].bytes - at_step[k - 1].bytes, v.bytes + world_bytes) << "step " << k + 1;
    EXPECT_EQ(at_step[k].calls - at_step[k - 1].calls, v.calls + world_calls) << "step " << k + 1;
    // Nothing but all-reduces during the steps (start-up may have broadcast or gathered).
    for (const auto& [op, calls] : ops[k]) {
      if (op == "all_reduce") continue;
      EXPECT_EQ(calls, ops[k - 1].count(op) ? ops[k - 1].at(op) : 0) << op << ", step " << k + 1;
    }
  }
}

// T = 2 x DP = 2 (world 4): the tensor group {0, 1} has a communicator of its own, which carries
// the model's exchanges and the gradient norm and nothing else, on every rank: the totals of the
// whole run are steps x the formula, exactly.
TEST_P(TensorParallelComms, TensorGroupOfItsOwnMovesExactlyTheFormula) {
  constexpr int kSteps = 3;
  const JobConfig cfg = job(4, /*stage=*/2, kSteps);
  ASSERT_EQ(cfg.micro_batch(), 2);  // 8 sequences = 2 x accumulation 2 x data-parallel 2
  std::mutex mu;
  std::vector<std::map<std::string, CollectiveTotals>> totals(4);
  std::vector<int> own(4, 0);
  testing::run_world(4, [&](const RankContext& ctx) {
    Trainer t(cfg, ctx, testing::quiet_trainer());
    t.run();
    const ProcessGroup& tensor = t.groups().tensor();
    std::lock_guard<std::mutex> lock(mu);
    own[static_cast<size_t>(ctx.rank)] =
        !tensor.is_world() && tensor.size() == 2 && &tensor.comm() != &t.groups().zero().comm();
    totals[static_cast<size_t>(ctx.rank)] = tensor.comm().collective_log()->totals();
  });
  const Volume v = per_step(cfg);
  for (int r = 0; r < 4; ++r) {
    const auto& t = totals[static_cast<size_t>(r)];
    ASSERT_TRUE(own[static_cast<size_t>(r)]) << "rank " << r;
    ASSERT_EQ(t.size(), 1u) << "rank " << r << ": only all-reduces on the tensor group";
    ASSERT_EQ(t.count("all_reduce"), 1u) << "rank " << r;
    EXPECT_EQ(t.at("all_reduce").bytes, kSteps * v.bytes) << "rank " << r;
    EXPECT_EQ(t.at("all_reduce").calls, kSteps * v.calls) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, TensorParallelComms,
                         ::testing::Values(testing::tiny_gpt2(), testing::tiny_llama()),
                         [](const auto& info) { return std::string(info.param.name); });

// comms_logger at T = 2 x DP = 2: rank 0 prints one block per communicator (tensor, data, world),
// named by its first group with the groups sharing it (tensor x context and tensor x pipeline
// have the tensor group's members), never a one-rank group, each kind with its bytes per step.
TEST(TensorParallelCommsLogger, PrintsEveryCommunicatorOnceWithBytesPerStep) {
  const TempCorpus corpus("zerod_tp_comms_logger");
  const JobConfig cfg =
      testing::tiny_job(corpus, 4, /*stage=*/2, 1, 2,
                        R"(, "parallelism": {"tensor": 2}, "comms_logger": {"enabled": true})");
  std::string text;
  {
    testing::CapturedLog log;
    testing::run_world(4, [&](const RankContext& ctx) {
      Trainer t(cfg, ctx);  // log_steps on: the end of the run prints the report
      t.run();
    });
    text = log.text();
  }
  const size_t at = text.find("(comms_logger), per communicator, 2 steps:");
  ASSERT_NE(at, std::string::npos) << text;
  const std::string report = text.substr(at);
  for (const char* title :
       {"group 'tensor' (global ranks 0, 1), also 'tensor x context', 'tensor x pipeline':",
        "group 'data' (global ranks 0, 2), also 'data x context':",
        "group 'world' (global ranks 0, 1, 2, 3) (the world communicator):"}) {
    EXPECT_NE(report.find(title), std::string::npos) << title << "\n" << report;
  }
  EXPECT_EQ(report.find("group 'context'"), std::string::npos) << report;   // a one-rank group
  EXPECT_EQ(report.find("group 'pipeline'"), std::string::npos) << report;  // a one-rank group
  // ZeRO-2 over the data group reduce-scatters and all-gathers; the tensor group all-reduces.
  for (const char* op : {"all_reduce", "reduce_scatter", "all_gather"})
    EXPECT_NE(report.find(std::string("  ") + op), std::string::npos) << op << "\n" << report;
  EXPECT_NE(report.find("/step"), std::string::npos) << report;
  EXPECT_NE(report.find("busbw"), std::string::npos) << report;
}

}  // namespace
}  // namespace zerod
