// communication_compression: PowerSGD's keys and defaults (PyTorch PowerSGDState's), the JSON
// round trip, and the refusals: unknown keys (listing the valid ones), an unknown type, a ZeRO
// stage it cannot serve (and so the optimizer offload), fp16, and a GPU run.
#include <gtest/gtest.h>

#include "config_test_util.h"

namespace zerod {
namespace {

using testing_config::contains;
using testing_config::job_with;
using testing_config::joined;
using testing_config::parse;
using testing_config::problems_of;
using Json = nlohmann::json;

TEST(CommunicationCompression, PowerSgdKeysDefaultsAndRoundTrip) {
  const JobConfig none = parse(testing_config::minimal_job().dump()).config;
  EXPECT_TRUE(none.communication_compression.type.empty());
  const JobConfig d =
      parse(job_with({{"communication_compression", {{"type", "PowerSGD"}}}})).config;
  const PowerSgdConfig& c = d.communication_compression.powersgd;
  EXPECT_EQ(d.communication_compression.type, "powersgd");
  EXPECT_EQ(c.rank, 1);
  EXPECT_EQ(c.start_iter, 1000);
  EXPECT_EQ(c.min_compression_rate, 2.0);
  EXPECT_TRUE(c.use_error_feedback);
  EXPECT_TRUE(c.warm_start);
  EXPECT_EQ(c.orthogonalization_epsilon, 0.0);
  EXPECT_EQ(c.random_seed, 0u);
  const JobConfig g = parse(job_with({{"communication_compression",
                                       {{"type", "powersgd"},
                                        {"rank", 4},
                                        {"start_iter", 10},
                                        {"min_compression_rate", 1.5},
                                        {"use_error_feedback", false},
                                        {"warm_start", false},
                                        {"orthogonalization_epsilon", 1e-8},
                                        {"random_seed", 7}}}}))
                          .config;
  const CommCompressionConfig& e = g.communication_compression;
  EXPECT_EQ(e.type, "powersgd");
  EXPECT_EQ(e.powersgd.rank, 4);
  EXPECT_EQ(e.powersgd.start_iter, 10);
  EXPECT_EQ(e.powersgd.min_compression_rate, 1.5);
  EXPECT_FALSE(e.powersgd.use_error_feedback);
  EXPECT_FALSE(e.powersgd.warm_start);
  EXPECT_EQ(e.powersgd.orthogonalization_epsilon, 1e-8);
  EXPECT_EQ(e.powersgd.random_seed, 7u);
  // job_to_json gives the section back, and parses to the same config.
  const Json j = job_to_json(g);
  ASSERT_TRUE(j.contains("communication_compression"));
  EXPECT_EQ(j["communication_compression"]["rank"], 4);
  Json again = j;
  again.erase("resolved");
  EXPECT_EQ(parse(again.dump()).config.communication_compression, e);
  EXPECT_FALSE(job_to_json(none).contains("communication_compression"));
}

TEST(CommunicationCompression, BadInputIsRefusedNamingTheKey) {
  const auto p =
      problems_of(job_with({{"communication_compression", {{"type", "powersgd"}, {"rnak", 4}}}}));
  EXPECT_TRUE(contains(p,
                       "communication_compression.rnak: unknown key; did you mean 'rank'? "
                       "(valid keys: type, rank, start_iter, min_compression_rate, "
                       "use_error_feedback, warm_start, orthogonalization_epsilon, "
                       "random_seed)"))
      << joined(p);
  EXPECT_TRUE(contains(problems_of(job_with({{"communication_compression", {{"rank", 4}}}})),
                       "communication_compression.type: required (supported: powersgd)"));
  EXPECT_TRUE(contains(problems_of(job_with({{"communication_compression", {{"type", "topk"}}}})),
                       "communication_compression.type"));
  EXPECT_TRUE(contains(
      problems_of(job_with({{"communication_compression", {{"type", "powersgd"}, {"rank", 0}}}})),
      "communication_compression.rank"));
  EXPECT_TRUE(contains(problems_of(job_with({{"communication_compression",
                                              {{"type", "powersgd"}, {"start_iter", -1}}}})),
                       "communication_compression.start_iter"));
  for (int stage : {1, 2, 3}) {
    const auto s = problems_of(job_with({{"communication_compression", {{"type", "powersgd"}}},
                                         {"zero_optimization", {{"stage", stage}}}}));
    EXPECT_TRUE(contains(s,
                         "communication_compression.type: \"powersgd\" serves "
                         "zero_optimization.stage 0 only"))
        << joined(s);
  }
  // The optimizer offload needs stage >= 1: refused with it.
  const auto off = problems_of(job_with(
      {{"communication_compression", {{"type", "powersgd"}}},
       {"zero_optimization", {{"stage", 2}, {"offload_optimizer", {{"device", "cpu"}}}}}}));
  EXPECT_TRUE(contains(off, "communication_compression.type")) << joined(off);
  EXPECT_TRUE(contains(problems_of(job_with({{"communication_compression", {{"type", "powersgd"}}},
                                             {"fp16", {{"enabled", true}}}})),
                       "cannot be combined with fp16"));
  EXPECT_TRUE(contains(problems_of(job_with({{"communication_compression", {{"type", "powersgd"}}},
                                             {"optimizer", {{"type", "OneBitAdam"}}}})),
                       "cannot be combined with optimizer.type OneBitAdam"));
}

// Over NCCL (the default for a data-parallel GPU job) PowerSGD is refused; over Gloo with host
// staging (train.device_comm gloo) it runs, as on CPU ranks.
TEST(CommunicationCompression, GpuRunOverNcclIsRefusedAtCheck) {
  JobConfig cfg = parse(job_with({{"communication_compression", {{"type", "powersgd"}}},
                                  {"train", {{"device", "cuda"}, {"device_comm", "nccl"}}}}))
                      .config;
  try {
    check_supported(cfg);
    ADD_FAILURE() << "PowerSGD over NCCL accepted";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(contains(e.problems(), "train.device_comm \"auto\" or \"gloo\""))
        << joined(e.problems());
  }
  for (DeviceComm comm : {DeviceComm::kGloo, DeviceComm::kAuto}) {  // (auto: Gloo for PowerSGD)
    cfg.train.device_comm = comm;
    EXPECT_NO_THROW(check_supported(cfg));
  }
  cfg.train.device = TrainDevice::kCpu;
  EXPECT_NO_THROW(check_supported(cfg));
}

}  // namespace
}  // namespace zerod
