// The step line and MFU's denominator on the CPU: the hardware peak (threads x clock x FLOP/cycle),
// an upper bound of what the matmul engine reaches; and MFU is never reported above 100%.
#include "engine/train/peak_flops.h"

#include <gtest/gtest.h>
#include <omp.h>

#include "train_test_util.h"

namespace zerod {
namespace {

TEST(PeakFlops, TheHardwarePeakBoundsWhatSgemmReaches) {
  std::string source;
  const double peak = cpu_hardware_peak_flops(omp_get_max_threads(), &source);
  ASSERT_GT(peak, 0) << source;
  EXPECT_NE(source.find("hardware: "), std::string::npos) << source;
  EXPECT_NE(source.find("GHz x"), std::string::npos) << source;
  EXPECT_NE(source.find("FLOP/cycle"), std::string::npos) << source;
  // What the start-up sgemm used to be compared with: never above the hardware peak.
  EXPECT_LE(measure_cpu_peak_flops(), peak * 1.02) << source;
  // Linear in the threads.
  EXPECT_DOUBLE_EQ(cpu_hardware_peak_flops(4, nullptr), 2 * cpu_hardware_peak_flops(2, nullptr));
}

TEST(PeakFlops, MfuIsNeverReportedAbove100Percent) {
  testing::TempCorpus corpus("zerod_peak_flops");
  // A peak far below what even a tiny model reaches.
  JobConfig cfg = testing::tiny_job(corpus, 1, 0, 1, 3);
  cfg.train.peak_flops = 1e3;
  std::vector<double> mfu;
  testing::run_world(1, [&](const RankContext& ctx) {
    Trainer t(cfg, ctx, testing::quiet_trainer());
    for (const auto& s : t.run().steps) mfu.push_back(s.mfu);
  });
  ASSERT_EQ(mfu.size(), 3u);
  for (double m : mfu) EXPECT_EQ(m, 1.0);
}

TEST(StepLine, ShowsTheGradientNormAndAnEta) {
  EXPECT_EQ(format_eta(0), "0s");
  EXPECT_EQ(format_eta(44.6), "45s");
  EXPECT_EQ(format_eta(192), "3m12s");
  EXPECT_EQ(format_eta(3720), "1h02m");
  EXPECT_EQ(format_eta(-1), "?");
  testing::TempCorpus corpus("zerod_step_line");
  JobConfig cfg = testing::tiny_job(corpus, 1, 0, 1, 4);
  cfg.steps_per_print = 1;
  testing::CapturedLog log;
  testing::run_world(1, [&](const RankContext& ctx) {
    TrainerOptions o;  // the step lines on
    Trainer t(cfg, ctx, o);
    t.run();
  });
  const std::string text = log.text();
  EXPECT_NE(text.find("step 1/4 | loss"), std::string::npos) << text;
  EXPECT_NE(text.find("| norm "), std::string::npos) << text;
  EXPECT_NE(text.find("| ETA "), std::string::npos) << text;
  EXPECT_NE(text.find("step 4/4"), std::string::npos) << text;
  EXPECT_NE(text.find("ETA 0s"), std::string::npos) << text;  // the last step: nothing left
}

}  // namespace
}  // namespace zerod
