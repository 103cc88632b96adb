// Muon under ZeRO (zero/muon_exchange.h): at world 2 the exchange gives each rank exactly the
// Newton-Schulz result of the whole matrix for its pieces (bit for bit what one rank computes),
// with a matrix straddling the shard boundary and both ranks owning matrices; and training with
// Muon gives the single rank's losses at stages 0, 1 and 3, offloaded to the CPU at stage 3
// (whole and split with offload_ratio) and on NVMe. (SGD/Adagrad/Lion's parity and resume tests,
// zero_parity_test.cc and checkpoint_test.cc, run Muon too: testing::other_optimizers().)
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "comm/collective_log.h"
#include "engine/config/model_spec.h"
#include "engine/train/trainer.h"
#include "kernels/cpu/muon.h"
#include "model/shard.h"
#include "tests/unit/comm/mesh_test_util.h"
#include "tests/unit/engine/train/train_test_util.h"
#include "zero/muon_exchange.h"

namespace zerod {
namespace {

ParamLayout tiny_layout() {
  testing::TempCorpus corpus("zerod_muon_layout");
  return ParamLayout(model_spec(testing::tiny_job(corpus, 1, 0, 1, 1).model));
}

// A deterministic value of element i of matrix k.
float value(size_t k, int64_t i) {
  return std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(k)) +
         0.01f * static_cast<float>(i % 7);
}

// Matrix k filled with value(k, i), orthogonalised whole on one thread, for each matrix.
std::vector<std::vector<float>> whole_results(const std::vector<MuonMatrix>& mats,
                                              const cpu::MuonNs& ns) {
  std::vector<std::vector<float>> out(mats.size());
  for (size_t k = 0; k < mats.size(); ++k) {
    const MuonMatrix& m = mats[k];
    out[k].resize(static_cast<size_t>(m.rows * m.cols));
    for (int64_t i = 0; i < m.rows * m.cols; ++i) out[k][static_cast<size_t>(i)] = value(k, i);
    std::vector<float> work(static_cast<size_t>(cpu::muon_ns_work_floats(m.rows, m.cols)));
    cpu::newton_schulz(out[k].data(), m.rows, m.cols, ns, work.data());
  }
  return out;
}

// partition_world 2: stages 1-3 (two all_to_all); 1: stage 0 (every rank holds every matrix,
// owners share their results with one all_gather).
void check_exchange(int partition_world) {
  const ParamLayout layout = tiny_layout();
  const Partition part(layout, partition_world);
  const std::vector<MuonMatrix> mats = muon_matrices(layout);
  // GPT-2: 4 matrices per block (c_attn, attn.c_proj, c_fc, mlp.c_proj), 2 blocks.
  ASSERT_EQ(mats.size(), 8u);
  int straddling = 0;
  for (const MuonMatrix& m : mats) {
    const int64_t cut = part.unit(m.unit).shard;  // rank 1's first element
    if (m.begin < cut && m.end() > cut) ++straddling;
  }
  if (partition_world == 2) EXPECT_GT(straddling, 0) << "no matrix straddles the shard boundary";
  // The expected results: each matrix orthogonalised whole on one thread.
  const cpu::MuonNs ns;
  const std::vector<std::vector<float>> want = whole_results(mats, ns);
  std::mutex mu;
  std::vector<int> owned(2, 0);
  testing::run_world(2, [&](const RankContext& ctx) {
    MuonExchange ex(layout, part, partition_world == 1 ? 0 : ctx.rank, ctx.comm);
    int64_t mine = 0;
    for (int u = 0; u < layout.num_units(); ++u) {
      for (const MuonPiece& p : ex.pieces(u)) {
        const MuonMatrix& m = ex.matrices()[static_cast<size_t>(p.matrix)];
        for (int64_t e = p.begin; e < p.end; ++e)
          ex.local()[p.slot + e - p.begin] = value(static_cast<size_t>(p.matrix), e - m.begin);
        mine += p.end - p.begin;
      }
    }
    EXPECT_GT(mine, 0);
    const CollectiveLog* log = ctx.comm->collective_log();
    const std::string op = partition_world == 1 ? "all_gather" : "all_to_all";
    const int64_t before = log ? log->totals()[op].bytes : 0;
    ex.orthogonalise(ns);
    int bad = 0;
    for (int u = 0; u < layout.num_units(); ++u) {
      for (const MuonPiece& p : ex.pieces(u)) {
        const MuonMatrix& m = ex.matrices()[static_cast<size_t>(p.matrix)];
        for (int64_t e = p.begin; e < p.end; ++e) {
          const float got = ex.local()[p.slot + e - p.begin];
          if (got != want[static_cast<size_t>(p.matrix)][static_cast<size_t>(e - m.begin)]) ++bad;
        }
      }
    }
    EXPECT_EQ(bad, 0) << "rank " << ctx.rank;
    if (log && partition_world == 2) {  // two all_to_all of 2 blocks each
      EXPECT_EQ(log->totals()[op].bytes - before, 2 * 2 * ex.block_floats() * 4);
    }
    if (log && partition_world == 1) EXPECT_GT(log->totals()[op].bytes - before, 0);
    std::lock_guard<std::mutex> lock(mu);
    for (const MuonMatrix& m : ex.matrices())
      owned[static_cast<size_t>(ctx.rank)] += m.owner == ctx.rank;
  });
  EXPECT_GT(owned[0], 0);
  EXPECT_GT(owned[1], 0);
}

TEST(MuonZero, ExchangeGivesEachRankTheWholeMatrixResultForItsPieces) {
  check_exchange(2);
}
TEST(MuonZero, StageZeroSharesEachOwnersResultsWithEveryRank) {
  check_exchange(1);
}

// Tensor parallelism, DP = 2 x T = 2: each rank holds its tensor slices of every matrix (GPT-2's
// c_attn as three stacked parts cut by rows, the output projections by columns; Llama's q/k/v and
// gate/up by rows, o/down by columns). The exchange gives every rank, at each element of its
// slices, the Newton-Schulz result of the whole matrix bit for bit (the slices are assembled in
// the single rank's element order), at stage 0 (partition world 1) and 1-3 (2).
void check_tensor_exchange(const testing::TinyModel& model, int partition_world) {
  testing::TempCorpus corpus("zerod_muon_tp_layout");
  const ModelSpec spec =
      model_spec(testing::tiny_job(corpus, 1, 0, 1, 1, "", "", 8, "", model).model);
  const std::vector<MuonMatrix> whole = muon_matrices(ParamLayout(spec));
  const cpu::MuonNs ns;
  const std::vector<std::vector<float>> want = whole_results(whole, ns);
  int split = 0;
  std::mutex mu;
  std::vector<int64_t> tensor_bytes(4, 0);
  test::run_mesh(MeshShape{.data = 2, .tensor = 2}, [&](int r, const ProcessGroups& groups) {
    TensorShard shard;
    shard.rank = groups.tensor().rank();
    shard.size = 2;
    const ParamLayout layout(spec, 16, shard);
    const Partition part(layout, partition_world);
    MuonExchange ex(layout, part, partition_world == 1 ? 0 : groups.zero().rank(),
                    &groups.zero().comm(), &groups.tensor().comm());
    ASSERT_EQ(ex.matrices().size(), whole.size());
    // Per matrix, the global element of each of this rank's elements.
    std::vector<std::vector<int64_t>> global(whole.size());
    int rank_split = 0;
    for (size_t k = 0; k < whole.size(); ++k) {
      const MuonMatrix& m = ex.matrices()[k];
      EXPECT_EQ(m.global_rows, whole[k].rows);
      EXPECT_EQ(m.global_cols, whole[k].cols);
      rank_split += m.split != Split::kReplicated;
      global[k].assign(static_cast<size_t>(m.rows * m.cols), -1);
      const TensorInfo& t = layout.unit(m.unit).tensors[static_cast<size_t>(m.tensor)];
      ASSERT_EQ(t.offset, m.begin);
      for_each_run(t, shard, [&](int64_t local, int64_t g, int64_t n) {
        for (int64_t i = 0; i < n; ++i) global[k][static_cast<size_t>(local + i)] = g + i;
      });
    }
    for (int u = 0; u < layout.num_units(); ++u) {
      for (const MuonPiece& p : ex.pieces(u)) {
        const auto& g = global[static_cast<size_t>(p.matrix)];
        const int64_t b = ex.matrices()[static_cast<size_t>(p.matrix)].begin;
        for (int64_t e = p.begin; e < p.end; ++e)
          ex.local()[p.slot + e - p.begin] =
              value(static_cast<size_t>(p.matrix), g[static_cast<size_t>(e - b)]);
      }
    }
    const CollectiveLog* log = groups.tensor().comm().collective_log();
    const int64_t before = log ? log->totals()["all_to_all"].bytes : 0;
    ex.orthogonalise(ns);
    int bad = 0, checked = 0;
    for (int u = 0; u < layout.num_units(); ++u) {
      for (const MuonPiece& p : ex.pieces(u)) {
        const auto& g = global[static_cast<size_t>(p.matrix)];
        const int64_t b = ex.matrices()[static_cast<size_t>(p.matrix)].begin;
        for (int64_t e = p.begin; e < p.end; ++e, ++checked) {
          const float w = want[static_cast<size_t>(p.matrix)]
                              [static_cast<size_t>(g[static_cast<size_t>(e - b)])];
          if (ex.local()[p.slot + e - p.begin] != w) ++bad;
        }
      }
    }
    EXPECT_EQ(bad, 0) << "rank " << r << " of " << checked;
    std::lock_guard<std::mutex> lock(mu);
    split = rank_split;
    if (log) tensor_bytes[static_cast<size_t>(r)] = log->totals()["all_to_all"].bytes - before;
  });
  EXPECT_GT(split, 0) << "no matrix is split";
  for (int64_t b : tensor_bytes) EXPECT_GT(b, 0) << "nothing went over the tensor group";
}

TEST(MuonZero, TensorSlicesAreOrthogonalisedWholeBitForBit) {
  for (const testing::TinyModel& m : {testing::tiny_gpt2(), testing::tiny_llama()}) {
    for (int world : {1, 2}) {
      SCOPED_TRACE(std::string(m.name) + " partition world " + std::to_string(world));
      check_tensor_exchange(m, world);
    }
  }
}

class MuonTraining : public ::testing::Test {
 protected:
  static std::vector<double> losses(int world, int stage, const std::string& zero_extra,
                                    const std::string& extra = "",
                                    const testing::TinyModel& model = testing::tiny_gpt2()) {
    testing::TempCorpus corpus("zerod_muon_train");
    const JobConfig cfg =
        testing::tiny_job(corpus, world, stage, 1, 6, extra, "", 8, zero_extra, model, kMuon);
    std::vector<double> out;
    testing::run_world(world, [&](const RankContext& ctx) {
      Trainer t(cfg, ctx, testing::quiet_trainer());
      const TrainResult res = t.run();
      if (ctx.rank == 0)
        for (const auto& s : res.steps) out.push_back(s.loss);
    });
    return out;
  }
  static constexpr const char* kMuon =
      R"({"type": "Muon", "params": {"lr": 0.02, "adam_lr": 3e-3, "weight_decay": 0.01,
          "adjust_lr_fn": "match_rms_adamw"}})";
};

TEST_F(MuonTraining, Stage0To3AndOffloadGiveTheSingleRankLosses) {
  const std::vector<double> single = losses(1, 0, "");
  ASSERT_EQ(single.size(), 6u);
  EXPECT_LT(single.back(), single.front() - 0.2) << "learns";
  const std::filesystem::path swap =
      std::filesystem::temp_directory_path() / ("zerod_muon_nvme_" + std::to_string(::getpid()));
  std::filesystem::create_directories(swap);
  struct Case {
    int stage;
    std::string zero_extra, what;
  };
  const std::vector<Case> cases = {
      {0, "", "stage 0"},
      {1, "", "stage 1"},
      {3, "", "stage 3"},
      {3, R"(, "offload_optimizer": {"device": "cpu"})", "stage 3, cpu offload"},
      {3, R"(, "offload_optimizer": {"device": "cpu", "ratio": 0.5})",
       "stage 3, offload ratio 0.5"},
      {3,
       R"(, "offload_optimizer": {"device": "nvme", "nvme_path": ")" + swap.string() +
           R"("}, "sub_group_size": 3000)",
       "stage 3, nvme"},
  };
  for (const Case& c : cases) {
    const std::vector<double> got = losses(2, c.stage, c.zero_extra);
    ASSERT_EQ(got.size(), single.size()) << c.what;
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_NEAR(got[i], single[i], 1e-5 * single[i]) << c.what << ", step " << i + 1;
  }
  std::filesystem::remove_all(swap);
}

// Tensor parallelism: T = 2 (and T = 2 x DP = 2 at ZeRO-1, and with sequence parallelism at
// ZeRO-3 offloaded) trains the single rank's Muon losses, for GPT-2 (c_attn's three parts) and
// a Llama with grouped-query attention and an untied head: each matrix is orthogonalised whole
// from its slices over the tensor group. (Slices orthogonalised on their own, the error this
// guards against, give other losses from step 2.)
TEST_F(MuonTraining, TensorParallelRanksGiveTheSingleRankLosses) {
  for (const testing::TinyModel& model : {testing::tiny_gpt2(), testing::tiny_llama()}) {
    const std::vector<double> single = losses(1, 0, "", "", model);
    ASSERT_EQ(single.size(), 6u);
    EXPECT_LT(single.back(), single.front() - 0.2) << "learns";
    struct Case {
      int world, stage;
      std::string extra, zero_extra, what;
    };
    const std::vector<Case> cases = {
        {2, 0, R"(, "parallelism": {"tensor": 2})", "", "T=2"},
        {4, 1, R"(, "parallelism": {"tensor": 2})", "", "T=2 x DP=2, stage 1"},
        {4, 3, R"(, "parallelism": {"tensor": 2, "sequence_parallel": true})",
         R"(, "offload_optimizer": {"device": "cpu"})", "T=2 (SP) x DP=2, stage 3 offloaded"},
    };
    for (const Case& c : cases) {
      const std::vector<double> got = losses(c.world, c.stage, c.zero_extra, c.extra, model);
      ASSERT_EQ(got.size(), single.size()) << c.what;
      double worst = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        worst = std::max(worst, std::abs(got[i] - single[i]) / single[i]);
        EXPECT_NEAR(got[i], single[i], 1e-5 * single[i])
            << model.name << ", " << c.what << ", step " << i + 1;
      }
      std::printf("%s, %s: largest relative loss difference %.2e\n", model.name, c.what.c_str(),
                  worst);
    }
  }
}

}  // namespace
}  // namespace zerod
