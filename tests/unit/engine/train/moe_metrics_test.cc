// Item 6 of the MoE issue through the whole trainer (threads of this process, Gloo over
// 127.0.0.1): the step metrics' routing (tokens per expert, dropped fraction) and router losses
// of a model with experts, aggregated over micro-batches and data-parallel (and tensor and
// context) ranks, the moe.csv the CSV monitor writes beside metrics.csv, and the comms logger's
// bytes of expert parallelism's all-to-all against rows x C x element size.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <numeric>
#include <string>

#include "comm/collective_log.h"
#include "comm/communicator.h"
#include "engine/metrics/moe_metrics.h"
#include "train_test_util.h"

namespace zerod {
namespace {

using testing::TempCorpus;
using testing::TinyModel;

// GPT-2 of 2 blocks (C = 32, block 0 sparse with moe_layer_frequency 2 when asked), 4 experts.
TinyModel moe_gpt2(const std::string& moe) {
  return testing::tiny_moe_gpt2(moe);
}

constexpr const char* kDropless =
    R"({"num_experts": 4, "top_k": 2, "drop_tokens": false, "router_z_loss_coef": 0.01})";
// Capacity 1.0 with a router bias toward no expert still drops: a random router is never
// exactly balanced, and every excess over N k / E is dropped.
constexpr const char* kCapacity =
    R"({"num_experts": 4, "top_k": 2, "capacity_factor": 1.0, "min_capacity": 1,
        "aux_loss_coef": 0.05, "router_z_loss_coef": 0.01, "moe_layer_frequency": 2})";

class MoeMetricsTrain : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { corpus_ = new TempCorpus("zerod_moe_metrics"); }
  static void TearDownTestSuite() {
    delete corpus_;
    corpus_ = nullptr;
  }
  static TempCorpus* corpus_;
};
TempCorpus* MoeMetricsTrain::corpus_ = nullptr;

// Global batch 8 sequences of 24 tokens, top-2: every step routes 8 x 24 x 2 assignments per
// MoE layer, over the world's ranks and the micro-batches.
constexpr int64_t kAssignments = 8 * 24 * 2;

void expect_counts_add_up(const MoeMetrics& m, size_t layers, const std::string& what) {
  ASSERT_EQ(m.layers.size(), layers) << what;
  for (const MoeLayerMetrics& l : m.layers) {
    ASSERT_EQ(l.tokens.size(), 4u) << what;
    EXPECT_EQ(l.assignments, kAssignments) << what;
    EXPECT_EQ(std::accumulate(l.tokens.begin(), l.tokens.end(), int64_t{0}),
              l.assignments - l.dropped)
        << what << " layer " << l.layer;
  }
}

TEST_F(MoeMetricsTrain, DroplessCountsEveryAssignmentOverRanksAndMicroBatches) {
  // 2 ranks x 2 micro-batches of 2 sequences: the metrics cover the whole global batch.
  const JobConfig cfg = testing::tiny_job(*corpus_, 2, 0, 2, 3, "", "", 8, "", moe_gpt2(kDropless));
  std::vector<std::vector<StepMetrics>> steps(2);
  testing::run_world(2, [&](const RankContext& ctx) {
    Trainer t(cfg, ctx, testing::quiet_trainer());
    steps[static_cast<size_t>(ctx.rank)] = t.run().steps;
  });
  ASSERT_EQ(steps[0].size(), 3u);
  for (size_t i = 0; i < steps[0].size(); ++i) {
    ASSERT_TRUE(steps[0][i].moe.has_value());
    const MoeMetrics& m = *steps[0][i].moe;
    expect_counts_add_up(m, 2, "dropless step " + std::to_string(i));
    EXPECT_EQ(m.dropped(), 0);
    for (const MoeLayerMetrics& l : m.layers) EXPECT_EQ(l.dropped_fraction(), 0.0);
    // Global: every rank reports the same numbers.
    const MoeMetrics& other = *steps[1][i].moe;
    EXPECT_EQ(other.layers[0].tokens, m.layers[0].tokens);
    EXPECT_EQ(other.aux_loss, m.aux_loss);
    // DeepSpeed's aux: the layers' own losses added; z-loss the same; both positive.
    EXPECT_NEAR(m.aux_loss, m.layers[0].aux_loss + m.layers[1].aux_loss, 1e-12);
    EXPECT_NEAR(m.z_loss, m.layers[0].z_loss + m.layers[1].z_loss, 1e-12);
    EXPECT_GT(m.aux_loss, 0.9);  // E sum f p >= 1 up to the finite sample
    EXPECT_GT(m.z_loss, 0.0);
    EXPECT_NEAR(m.objective, 0.01 * m.aux_loss + 0.01 * m.z_loss, 1e-9);
  }
  const std::string line = moe_log_fields(*steps[0][0].moe);
  EXPECT_NE(line.find(" | moe aux "), std::string::npos) << line;
  EXPECT_NE(line.find(" drop 0.0% "), std::string::npos) << line;
}

// Tensor ranks route the same rows alike (counted once); context ranks route their own rows
// (summed), with the router losses of the whole micro-batch on each: at T = 2 and at C = 2 the
// counts cover the global batch once and both ranks report the same numbers.
TEST_F(MoeMetricsTrain, TensorAndContextRanksCountTheGlobalBatchOnce) {
  for (const char* par :
       {R"(, "parallelism": {"tensor": 2})", R"(, "parallelism": {"context": 2})"}) {
    const JobConfig cfg =
        testing::tiny_job(*corpus_, 2, 0, 2, 2, par, "", 8, "", moe_gpt2(kDropless));
    std::vector<std::vector<StepMetrics>> steps(2);
    testing::run_world(2, [&](const RankContext& ctx) {
      Trainer t(cfg, ctx, testing::quiet_trainer());
      steps[static_cast<size_t>(ctx.rank)] = t.run().steps;
    });
    for (size_t i = 0; i < steps[0].size(); ++i) {
      ASSERT_TRUE(steps[0][i].moe.has_value() && steps[1][i].moe.has_value());
      expect_counts_add_up(*steps[0][i].moe, 2, std::string(par) + " step " + std::to_string(i));
      EXPECT_EQ(steps[1][i].moe->layers[0].tokens, steps[0][i].moe->layers[0].tokens) << par;
      EXPECT_EQ(steps[1][i].moe->aux_loss, steps[0][i].moe->aux_loss) << par;
      EXPECT_GT(steps[0][i].moe->aux_loss, 0.9) << par;
    }
  }
}

TEST_F(MoeMetricsTrain, CapacityDropsAndTheAuxLossIsTheModels) {
  // One rank, one micro-batch: the step's metrics are the model's last forward's.
  const JobConfig cfg = testing::tiny_job(*corpus_, 1, 0, 1, 2, "", "", 8, "", moe_gpt2(kCapacity));
  Trainer t(cfg, testing::quiet_trainer());
  const TrainResult res = t.run();
  ASSERT_EQ(res.steps.size(), 2u);
  const MoeMetrics& m = *res.steps.back().moe;
  expect_counts_add_up(m, 1, "capacity");
  EXPECT_EQ(m.layers[0].layer, 0);
  EXPECT_GT(m.dropped(), 0);
  EXPECT_GT(m.layers[0].dropped_fraction(), 0.0);
  // Capacity 1.0: each expert keeps at most ceil(N k / E) rows.
  for (int64_t n : m.layers[0].tokens) EXPECT_LE(n, kAssignments / 4);
  const MoeStepStats s = t.model().moe_stats();
  EXPECT_EQ(s.kept[0], m.layers[0].tokens);
  EXPECT_EQ(s.dropped[0], m.layers[0].dropped);
  EXPECT_DOUBLE_EQ(s.aux_loss, m.aux_loss);
  EXPECT_DOUBLE_EQ(s.z_loss, m.z_loss);
  EXPECT_DOUBLE_EQ(s.objective, m.objective);
  EXPECT_NEAR(m.objective, 0.05 * m.aux_loss + 0.01 * m.z_loss, 1e-9);
  const std::string line = moe_log_fields(m);
  EXPECT_EQ(line.find(" drop 0.0% "), std::string::npos) << line;
}

TEST_F(MoeMetricsTrain, CsvMonitorWritesMoeCsvBesideTheMetrics) {
  const std::string dir = (corpus_->dir() / "monitor").string();
  std::filesystem::remove_all(dir);
  const JobConfig cfg = testing::tiny_job(
      *corpus_, 1, 0, 1, 2,
      R"(, "csv_monitor": {"enabled": true, "output_path": ")" + dir + R"(", "job_name": "moe"})",
      "", 8, "", moe_gpt2(kCapacity));
  Trainer t(cfg, testing::quiet_trainer());
  const TrainResult res = t.run();
  std::ifstream in(dir + "/moe/moe.csv");
  ASSERT_TRUE(in.good());
  std::string header, row;
  std::getline(in, header);
  EXPECT_EQ(header,
            "step,layer,aux_loss,z_loss,dropped_fraction,tokens_0,tokens_1,tokens_2,tokens_3");
  std::vector<std::string> rows;
  while (std::getline(in, row)) rows.push_back(row);
  ASSERT_EQ(rows.size(), 4u);  // 2 steps x (layer 0, all)
  EXPECT_EQ(rows[0], moe_csv_rows(1, *res.steps[0].moe)[0]);
  EXPECT_EQ(rows[3].rfind("2,all,", 0), 0u) << rows[3];
}

TEST_F(MoeMetricsTrain, DenseModelsHaveNoMoeMetrics) {
  const JobConfig cfg = testing::tiny_job(*corpus_, 1, 0, 1, 1);
  Trainer t(cfg, testing::quiet_trainer());
  EXPECT_FALSE(t.run().steps.back().moe.has_value());
}

// The comms logger's bytes of expert parallelism (2 ranks, E = 2, one MoE layer, one step of one
// micro-batch per rank): each row a rank routes to the other rank's experts crosses four times
// (its x forward out, its y back, its dy out in backward, its dx back), each a message of C
// elements of 4 bytes under "send" on the sender and "recv" on the receiver; the counts go first
// in an all-to-all of the 4 experts' int64 counts per MoE layer forward.
TEST_F(MoeMetricsTrain, ExpertAllToAllBytesAreRowsTimesChannelsTimesElementSize) {
  const JobConfig cfg = testing::tiny_job(*corpus_, 2, 0, 1, 1, R"(, "parallelism": {"expert": 2})",
                                          "", 8, "", moe_gpt2(kCapacity));
  std::mutex mu;
  int64_t cross_rows = 0;  // rows routed to the other rank's experts, both ranks
  std::vector<std::map<std::string, CollectiveTotals>> totals(2);
  testing::run_world(2, [&](const RankContext& ctx) {
    const std::map<std::string, CollectiveTotals> before = ctx.comm->collective_log()->totals();
    Trainer t(cfg, ctx, testing::quiet_trainer());
    t.run();
    std::map<std::string, CollectiveTotals> after = ctx.comm->collective_log()->totals();
    for (auto& [op, tot] : after) {
      auto it = before.find(op);
      if (it != before.end()) {
        tot.calls -= it->second.calls;
        tot.bytes -= it->second.bytes;
      }
    }
    const MoeStepStats s = t.model().moe_stats();
    // Rank r computes experts [2r, 2r + 2); its rows for the others' experts leave it.
    const size_t other = ctx.rank == 0 ? 2 : 0;
    std::lock_guard<std::mutex> lock(mu);
    cross_rows += s.kept[0][other] + s.kept[0][other + 1];
    totals[static_cast<size_t>(ctx.rank)] = after;
  });
  ASSERT_GT(cross_rows, 0);
  const int64_t C = 32, esz = 4;
  int64_t sent = 0, received = 0;
  for (const auto& t : totals) {
    sent += t.count("send") ? t.at("send").bytes : 0;
    received += t.count("recv") ? t.at("recv").bytes : 0;
    ASSERT_TRUE(t.count("all_to_all"));
    EXPECT_EQ(t.at("all_to_all").calls, 1);      // one MoE layer, one forward
    EXPECT_EQ(t.at("all_to_all").bytes, 4 * 8);  // the 4 experts' counts
  }
  std::printf("cross-rank rows %lld: sent %lld B, received %lld B\n",
              static_cast<long long>(cross_rows), static_cast<long long>(sent),
              static_cast<long long>(received));
  EXPECT_EQ(sent, 4 * cross_rows * C * esz);
  EXPECT_EQ(received, sent);
}

}  // namespace
}  // namespace zerod
