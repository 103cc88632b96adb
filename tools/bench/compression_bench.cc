// Communication-compression benchmark (issue 24): the benchmark shape trained at world --world
// (threads of this process, Gloo over loopback) with each rank's sends throttled to --link-bits
// bits per second (comm/gloo/rate_limiter.h: a throttle in the Gloo transport, not a shaped
// interface), three ways in one run, alternating for --rounds rounds:
//
//   AdamW        the baseline: the gradients all-reduced every step
//   PowerSGD r   communication_compression powersgd, rank --rank, from the first step
//   OneBitAdam   1-bit Adam (the onebit optimizer), freeze_step = --warmup: the measured steps
//                exchange sign bits
//
// Per setting: the median step time over the measured steps, and the bytes per step of rank 0's
// data-parallel communicator from the comms logger (comm/collective_log.h), over the measured
// steps only, twice: by NCCL's size convention (the buffer each rank reduces, the whole buffer of
// an all-to-all or all-gather) and as bytes sent by the rank (CollectiveLog::sent_bytes); with
// the ratios against AdamW. Exits 1 when PowerSGD's bytes per step are not at least 10x smaller,
// or OneBitAdam's bytes sent per step not at least 16x smaller, than AdamW's.
//
//   zerod_compression_bench [--world 2] [--rank 4] [--link-bits 1e9] [--steps 4] [--warmup 2]
//                           [--rounds 1] [shape flags as zerod_train_bench]
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bench_job.h"
#include "comm/collective_log.h"
#include "comm/store.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/runtime/local_ranks.h"
#include "engine/train/trainer.h"

using namespace zerod;

namespace {

struct Setting {
  std::string name;
  std::string extra;        // top-level JSON members
  std::string onebit_type;  // non-empty: the optimizer type replacing AdamW
  std::vector<double> seconds;
  double bytes_per_step = 0;  // NCCL's size
  double sent_per_step = 0;   // sent by the rank
};

struct Logged {
  double bytes = 0, sent = 0;
};

Logged logged_bytes(const Communicator& c) {
  Logged l;
  if (const CollectiveLog* log = c.collective_log()) {
    for (const auto& [op, totals] : log->totals()) {
      l.bytes += static_cast<double>(totals.bytes);
      l.sent += log->sent_bytes(op, static_cast<double>(totals.bytes));
    }
  }
  return l;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  log::init();
  CLI::App app{"zerod communication-compression benchmark (PowerSGD, 1-bit Adam vs AdamW)"};
  int world = 2, rank = 4, steps = 4, warmup = 2, rounds = 1;
  double link_bits = 1e9;
  bench::BenchShape shape;
  shape.seq = 128;
  shape.batch = 2;
  app.add_option("--world", world, "ranks (threads)")->capture_default_str();
  app.add_option("--rank", rank, "PowerSGD's rank")->capture_default_str();
  app.add_option("--link-bits", link_bits, "each rank's send rate, bits/s (0: unthrottled)")
      ->capture_default_str();
  app.add_option("--steps", steps, "measured steps per run")->capture_default_str();
  app.add_option("--warmup", warmup, "unmeasured first steps (1-bit Adam's freeze_step)")
      ->capture_default_str();
  app.add_option("--rounds", rounds, "runs of each setting, alternating")->capture_default_str();
  shape.add_options(app);
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::warn);
  try {
    ZD_CHECK_INPUT(world >= 2 && rank >= 1 && steps >= 1 && warmup >= 1,
                   "--world {} (>= 2), --rank {}, --steps {}, --warmup {} (>= 1)", world, rank,
                   steps, warmup);
    if (link_bits > 0) {
      ::setenv("ZEROD_GLOO_RATE_LIMIT_BPS", fmt::format("{}", link_bits).c_str(), 1);
    } else {
      ::unsetenv("ZEROD_GLOO_RATE_LIMIT_BPS");
    }
    const int64_t global = int64_t{shape.batch} * world;
    const bench::SyntheticData data(shape, global * (steps + warmup + 2));
    std::vector<Setting> settings = {
        {"AdamW", "", "", {}, 0},
        {fmt::format("PowerSGD r{}", rank),
         fmt::format(R"(, "communication_compression": {{"type": "powersgd", "rank": {}, )"
                     R"("start_iter": 0}})",
                     rank),
         "",
         {},
         0},
        {"OneBitAdam", "", "OneBitAdam", {}, 0},
    };
    fmt::print(
        "compression benchmark: world {} (threads, {} core(s)), Gloo sends throttled to {} "
        "bits/s per rank; {} {} layers, {} wide, {} heads, seq {}, vocab {}, {}, ZeRO stage 0; "
        "micro-batch {} per rank; {} x ({} warm-up + {} measured steps) per setting\n",
        world, std::thread::hardware_concurrency(),
        link_bits > 0 ? fmt::format("{:g}", link_bits) : std::string("unlimited"), shape.model,
        shape.layers, shape.embd, shape.heads, shape.seq, shape.vocab, shape.dtype, shape.batch,
        rounds, warmup, steps);
    for (int round = 0; round < rounds; ++round) {
      for (Setting& s : settings) {
        JobConfig job =
            bench::bench_job(shape, data, steps + warmup, world, R"({"stage": 0})", s.extra);
        job.wall_clock_breakdown = false;
        if (!s.onebit_type.empty()) {
          job.optimizer.type = s.onebit_type;
          job.optimizer.onebit.freeze_step = warmup;
        }
        std::mutex mu;
        LocalRanksOptions o;
        o.world_size = world;
        o.local_world_size = world;
        o.store = std::make_shared<MemoryStore>();
        o.store_prefix = fmt::format("compression_bench_{}_{}", round, s.name);
        run_local_ranks(o, [&](const RankContext& ctx) {
          TrainerOptions opts;
          opts.log_steps = false;
          // The bytes of the measured steps: the log's totals after the warm-up's, at the end.
          const Communicator* comm = nullptr;
          int seen = 0;
          Logged before;
          opts.on_step = [&](const StepMetrics&) {
            if (++seen == warmup && comm != nullptr) before = logged_bytes(*comm);
          };
          Trainer t(job, ctx, opts);
          comm = &t.groups().zero().comm();
          const TrainResult r = t.run();
          if (ctx.rank != 0) return;
          std::lock_guard<std::mutex> lock(mu);
          for (size_t i = static_cast<size_t>(warmup); i < r.steps.size(); ++i)
            s.seconds.push_back(r.steps[i].seconds);
          const Logged after = logged_bytes(*comm);
          s.bytes_per_step = (after.bytes - before.bytes) / static_cast<double>(steps);
          s.sent_per_step = (after.sent - before.sent) / static_cast<double>(steps);
        });
      }
    }
    const double base_t = median(settings[0].seconds), base_b = settings[0].bytes_per_step;
    const double base_s = settings[0].sent_per_step;
    fmt::print("{:>14} {:>10} {:>10} {:>14} {:>11} {:>14} {:>11}\n", "setting", "step ms",
               "vs AdamW", "NCCL B/step", "AdamW / it", "sent B/step", "AdamW / it");
    for (const Setting& s : settings) {
      const double m = median(s.seconds);
      fmt::print("{:>14} {:>10.1f} {:>10.3f} {:>14.0f} {:>11.4f} {:>14.0f} {:>11.4f}\n", s.name,
                 m * 1e3, m / base_t, s.bytes_per_step, base_b / s.bytes_per_step, s.sent_per_step,
                 base_s / s.sent_per_step);
    }
    const double psgd_ratio = base_b / settings[1].bytes_per_step;
    const double onebit_sent = base_s / settings[2].sent_per_step;
    fmt::print(
        "result: PowerSGD r{} moves {:.1f}x fewer bytes per step than AdamW (required >= 10x), "
        "step time {:.2f}x AdamW's; OneBitAdam sends {:.2f}x fewer bytes (required >= 16x; "
        "{:.4f}x by NCCL's size), step time {:.2f}x\n",
        rank, psgd_ratio, median(settings[1].seconds) / base_t, onebit_sent,
        base_b / settings[2].bytes_per_step, median(settings[2].seconds) / base_t);
    if (psgd_ratio < 10 || onebit_sent < 16) {
      fmt::print(stderr,
                 "zerod_compression_bench: PowerSGD {:.1f}x (< 10x?) or OneBitAdam {:.2f}x "
                 "(< 16x?) fewer bytes per step than AdamW\n",
                 psgd_ratio, onebit_sent);
      return 1;
    }
  } catch (const InputError& e) {
    fmt::print(stderr, "zerod_compression_bench: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "zerod_compression_bench: {}\n", e.what());
    return 1;
  }
  return 0;
}
