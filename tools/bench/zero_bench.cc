// ZeRO step-time benchmark: the benchmark shape trained by `--world` ranks (threads of this
// process, Gloo over loopback) at each ZeRO stage, median step time per stage and its ratio to
// stage 0 measured in the same run.
//
//   zerod_zero_bench [--world 2] [--stages 0,1,2,3] [--steps 8] [--warmup 2] [--overlap]
//                    [shape flags as zerod_train_bench]
#include <CLI/CLI.hpp>

#include <algorithm>
#include <mutex>
#include <vector>

#include "bench_job.h"
#include "comm/store.h"
#include "core/log.h"
#include "engine/runtime/local_ranks.h"
#include "engine/train/trainer.h"

using namespace zerod;

int main(int argc, char** argv) {
  log::init();
  CLI::App app{"zerod ZeRO step-time benchmark"};
  int world = 2, steps = 8, warmup = 2;
  std::vector<int> stages = {0, 1, 2, 3};
  bool overlap = false;
  bench::BenchShape shape;
  app.add_option("--world", world, "ranks (threads)")->capture_default_str();
  app.add_option("--stages", stages, "ZeRO stages to run")->delimiter(',')->capture_default_str();
  app.add_option("--steps", steps, "measured steps per stage")->capture_default_str();
  app.add_option("--warmup", warmup, "unmeasured first steps")->capture_default_str();
  app.add_flag("--overlap", overlap, "overlap_comm on at every stage (stage 3 always overlaps)");
  bool offload = false;
  app.add_flag("--offload-optimizer", offload,
               "offload_optimizer device cpu (stages 1-3): master and moments in host memory");
  shape.add_options(app);
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::warn);

  const bench::SyntheticData data(shape, int64_t{shape.batch} * world * (steps + warmup + 2));
  fmt::print(
      "ZeRO benchmark: world {} (threads), {} layers, {} wide, seq {}, micro-batch {} per rank, "
      "vocab {}, {}\n",
      world, shape.layers, shape.embd, shape.seq, shape.batch, shape.vocab, shape.dtype);
  fmt::print("{:>5} {:>10} {:>10} {:>14} {:>10} {:>16}\n", "stage", "step ms", "tokens/s",
             "comm wait ms", "vs stage 0", "model states MiB");
  double base = 0;
  for (int stage : stages) {
    const std::string zero =
        fmt::format(R"({{"stage": {}{}{}}})", stage, overlap ? R"(, "overlap_comm": true)" : "",
                    offload && stage >= 1 ? R"(, "offload_optimizer": {"device": "cpu"})" : "");
    const JobConfig job = bench::bench_job(shape, data, steps + warmup, world, zero);
    std::mutex mu;
    std::vector<double> seconds;
    double comm = 0, states = 0;
    LocalRanksOptions o;
    o.world_size = world;
    o.local_world_size = world;
    o.store = std::make_shared<MemoryStore>();
    o.store_prefix = fmt::format("stage{}", stage);
    run_local_ranks(o, [&](const RankContext& ctx) {
      TrainerOptions opts;
      opts.log_steps = false;
      Trainer t(job, ctx, opts);
      const TrainResult r = t.run();
      if (ctx.rank != 0) return;
      std::lock_guard<std::mutex> lock(mu);
      for (size_t i = static_cast<size_t>(warmup); i < r.steps.size(); ++i)
        seconds.push_back(r.steps[i].seconds);
      comm = r.comm_wait_seconds / static_cast<double>(r.steps.size());
      states = static_cast<double>(t.engine().measured_bytes().states()) / (1 << 20);
    });
    std::sort(seconds.begin(), seconds.end());
    const double median = seconds[seconds.size() / 2];
    if (stage == stages.front()) base = median;
    fmt::print("{:>5} {:>10.1f} {:>10.0f} {:>14.1f} {:>10.2f} {:>16.1f}\n", stage, median * 1e3,
               double(shape.batch) * world * shape.seq / median, comm * 1e3, median / base, states);
  }
  return 0;
}
