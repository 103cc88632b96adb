// Pipeline benchmark (issue 22 item 6): the CPU benchmark shape trained seven ways at one global
// batch of M micro-batches, rank threads of this process (Gloo over loopback, one OpenMP thread
// each):
//
//   P=1        the baseline: one rank, M micro-batches accumulated
//   gpipe      parallelism.pipeline P, every forward then every backward
//   1f1b       parallelism.pipeline P, one forward one backward
//   zero_bubble parallelism.pipeline P, ZB-H1: 1F1B with the backward split into its input
//              gradient (Bi) and its weight gradient (W), which fills the cool-down's waits
//   interleaved parallelism.pipeline P with --virtual-stages V chunks per rank (interleaved 1F1B:
//              the bubble divided by V, at V times the messages)
//   1f1b@action, interl.@action  the same two with ZEROD_PIPELINE_PREFETCH=0: each receive posted
//              at its action, as the runner did before it posted them ahead (the baseline of
//              that change)
//
// For each: the median step time and its ratio to P=1, the measured bubble (the fraction of the
// step the ranks spent outside compute, averaged over the ranks: StepMetrics::pipeline_bubble)
// against the formula (P-1)/(P-1+M), and the first stage's peak activation memory. The settings
// alternate for --rounds rounds, so a load that drifts touches each.
//
//   zerod_pipeline_bench [--stages 2] [--micro-batches 8] [--steps 4] [--warmup 1] [--rounds 2]
//                        [shape flags as zerod_train_bench, --model gpt2|llama]
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bench_job.h"
#include "comm/store.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/config/parse.h"
#include "engine/runtime/local_ranks.h"
#include "engine/train/trainer.h"

using namespace zerod;

namespace {

struct Setting {
  std::string name;      // "P=1", "gpipe", "1f1b", "zero_bubble", "interleaved", "...@action"
  std::string schedule;  // parallelism.pipeline_schedule
  int stages = 1;
  int virtual_stages = 1;
  // ZEROD_PIPELINE_PREFETCH: "0" posts each receive at its action (the runner's behaviour before
  // receives were posted ahead), null the default (2 ahead).
  const char* prefetch = nullptr;
  std::vector<double> seconds, bubbles;  // measured steps, every round
  double activations_mib = 0;            // rank 0 (the first stage), peak
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  log::init();
  CLI::App app{
      "zerod pipeline benchmark (GPipe, 1F1B, zero-bubble and interleaved 1F1B against one rank "
      "at one global batch)"};
  int stages = 2, micro = 8, steps = 4, warmup = 1, rounds = 2, virtual_stages = 2;
  bench::BenchShape shape;
  app.add_option("--stages", stages, "parallelism.pipeline P")->capture_default_str();
  app.add_option("--micro-batches", micro, "micro-batches per step M")->capture_default_str();
  app.add_option("--virtual-stages", virtual_stages, "chunks per rank V of the interleaved run")
      ->capture_default_str();
  app.add_option("--steps", steps, "measured steps per run")->capture_default_str();
  app.add_option("--warmup", warmup, "unmeasured first steps of each run")->capture_default_str();
  app.add_option("--rounds", rounds, "runs of each setting, alternating")->capture_default_str();
  shape.add_options(app);
  shape.add_model_options(app);
  CLI11_PARSE(app, argc, argv);
  shape.apply_model_defaults(app);
  spdlog::set_level(spdlog::level::warn);
  try {
    ZD_CHECK_INPUT(stages >= 2 && micro >= stages,
                   "--stages {} must be >= 2 and <= --micro-batches {}", stages, micro);
    const int64_t global = int64_t{shape.batch} * micro;  // sequences per step
    const bench::SyntheticData data(shape, global * (steps + warmup + 2));
    std::vector<Setting> settings = {
        {"P=1", "1f1b", 1, 1},
        {"gpipe", "gpipe", stages, 1},
        {"1f1b", "1f1b", stages, 1},
        {"zero_bubble", "zero_bubble", stages, 1},
        {"interleaved", "interleaved_1f1b", stages, virtual_stages},
        {"1f1b@action", "1f1b", stages, 1, "0"},
        {"interl.@action", "interleaved_1f1b", stages, virtual_stages, "0"}};
    fmt::print(
        "pipeline benchmark: P = {} (threads, {} core(s)), {} {} layers, {} wide, {} heads, seq "
        "{}, vocab {}, {}; {} micro-batches of {} sequences a step; {} x ({} warm-up + {} "
        "measured steps) per setting\n",
        stages, std::thread::hardware_concurrency(), shape.model, shape.layers, shape.embd,
        shape.heads, shape.seq, shape.vocab, shape.dtype, micro, shape.batch, rounds, warmup,
        steps);
    for (int round = 0; round < rounds; ++round) {
      for (Setting& s : settings) {
        // (Resolved for one rank, then given the pipeline and the M micro-batches.)
        JobConfig job = bench::bench_job(shape, data, steps + warmup, 1);
        job.parallelism.pipeline = s.stages;
        if (s.stages > 1) {
          job.parallelism.pipeline_schedule = s.schedule;
          job.parallelism.virtual_stages = s.virtual_stages;
        }
        if (s.prefetch != nullptr) {
          setenv("ZEROD_PIPELINE_PREFETCH", s.prefetch, 1);
        } else {
          unsetenv("ZEROD_PIPELINE_PREFETCH");
        }
        job.gradient_accumulation_steps = micro;
        job.train_micro_batch_size_per_gpu = shape.batch;
        job.train_batch_size = global;
        resolve_job(job, s.stages);  // (checks the triangle and the schedule's needs again)
        job.wall_clock_breakdown = false;
        ZD_CHECK(job.global_batch() == global, "{}: global batch {}, expected {}", s.name,
                 job.global_batch(), global);
        std::mutex mu;
        LocalRanksOptions o;
        o.world_size = s.stages;
        o.local_world_size = s.stages;
        o.threads_per_rank = 1;
        o.store = std::make_shared<MemoryStore>();
        o.store_prefix = fmt::format("pp_bench_{}_{}", round, s.name);
        run_local_ranks(o, [&](const RankContext& ctx) {
          TrainerOptions opts;
          opts.log_steps = false;
          Trainer t(job, ctx, opts);
          const TrainResult r = t.run();
          if (ctx.rank != 0) return;
          std::lock_guard<std::mutex> lock(mu);
          for (size_t i = static_cast<size_t>(warmup); i < r.steps.size(); ++i) {
            s.seconds.push_back(r.steps[i].seconds);
            if (r.steps[i].pipeline_bubble) s.bubbles.push_back(*r.steps[i].pipeline_bubble);
          }
          s.activations_mib =
              static_cast<double>(t.memory().peak(MemCategory::kActivations)) / (1 << 20);
        });
      }
    }
    const double formula = static_cast<double>(stages - 1) / (stages - 1 + micro);
    const double base = median(settings[0].seconds);
    fmt::print("{:>14} {:>10} {:>10} {:>10} {:>14} {:>14} {:>18}\n", "setting", "step ms",
               "tokens/s", "vs P=1", "bubble meas.", "bubble formula", "stage-0 activ. MiB");
    for (const Setting& s : settings) {
      const double m = median(s.seconds);
      fmt::print("{:>14} {:>10.1f} {:>10.0f} {:>10.2f} {:>14} {:>14} {:>18.1f}\n", s.name, m * 1e3,
                 static_cast<double>(global * shape.seq) / m, base / m,
                 s.stages > 1 ? fmt::format("{:.3f}", median(s.bubbles)) : "-",
                 s.stages > 1 ? fmt::format("{:.3f}", formula) : "-", s.activations_mib);
    }
    fmt::print(
        "result: 1f1b bubble {:.3f} measured against (P-1)/(P-1+M) = {:.3f} ({:+.1f} points); "
        "speed-up over P=1 {:.2f}x; gpipe / 1f1b stage-0 activations {:.2f}\n",
        median(settings[2].bubbles), formula, 100 * (median(settings[2].bubbles) - formula),
        base / median(settings[2].seconds),
        settings[1].activations_mib / settings[2].activations_mib);
    fmt::print(
        "result: zero_bubble bubble {:.3f} against 1f1b {:.3f} ({:+.1f} points), step time "
        "1f1b / zero_bubble {:.3f}; zero_bubble / 1f1b stage-0 activations {:.2f}\n",
        median(settings[3].bubbles), median(settings[2].bubbles),
        100 * (median(settings[3].bubbles) - median(settings[2].bubbles)),
        median(settings[2].seconds) / median(settings[3].seconds),
        settings[3].activations_mib / settings[2].activations_mib);
    fmt::print(
        "result: interleaved (V = {}) bubble {:.3f} against (P-1)/(P-1+M)/V = {:.3f} and 1f1b "
        "{:.3f}; step time 1f1b / interleaved {:.3f}\n",
        virtual_stages, median(settings[4].bubbles), formula / virtual_stages,
        median(settings[2].bubbles), median(settings[2].seconds) / median(settings[4].seconds));
    fmt::print(
        "result: receives posted ahead against at their actions: 1f1b bubble {:.3f} vs {:.3f}, "
        "step time ratio {:.3f}; interleaved bubble {:.3f} vs {:.3f}, step time ratio {:.3f}\n",
        median(settings[2].bubbles), median(settings[5].bubbles),
        median(settings[5].seconds) / median(settings[2].seconds), median(settings[4].bubbles),
        median(settings[6].bubbles), median(settings[6].seconds) / median(settings[4].seconds));
  } catch (const InputError& e) {
    fmt::print(stderr, "zerod_pipeline_bench: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "zerod_pipeline_bench: {}\n", e.what());
    return 1;
  }
  return 0;
}
