// Tensor-parallel step-time benchmark: the CPU benchmark shape trained by `--world` ranks
// (threads of this process, Gloo over loopback) two ways at the same global batch, and the ratio
// of their median step times:
//
//   DP=W       the baseline: data parallelism over every rank, micro-batch B per rank
//   T x DP     parallelism.tensor T: each tensor group of T ranks trains one replica's
//              micro-batch of B x T sequences (global batch B x W either way)
//
// or, with --expert E (and --experts N: a model whose MLPs are N dropless experts), expert
// parallelism against E = 1 at the same micro-batch per rank:
//
//   E=1        every rank computes all N experts for its own tokens
//   E=E        groups of E ranks exchange tokens in all-to-alls and each computes N / E experts
//
// Both are measured in the same run, alternating for --rounds rounds (the median over all of a
// setting's measured steps), so a load that drifts during the run touches both. Besides the step
// time: tokens/s, the bytes per step on rank 0's communicators (the tensor group's all-reduces of
// activations against data parallelism's gradient reduction), rank 0's model states and peak
// activations.
//
// With --optimizer adamw,muon both settings run with each optimizer (Muon: the hidden matrices,
// orthogonalised whole over the tensor group under T, zero/muon_exchange.h), so the table shows
// Muon's cost against AdamW in either setting, in the same run.
//
//   zerod_tp_bench [--world 2] [--tensor 2 | --expert 2 --experts 4 [--top-k 2]] [--stage 0]
//                  [--optimizer adamw[,muon]] [--steps 6] [--warmup 2] [--rounds 2]
//                  [shape flags as zerod_train_bench, --model gpt2|llama]
#include <CLI/CLI.hpp>

#include <algorithm>
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
  std::string name;  // "DP=2", "T=2", "E=1", "E=2" (with --optimizer adamw,muon: "T=2 muon")
  int tensor = 1, expert = 1;
  std::string optimizer = "adamw";
  std::vector<double> seconds;  // rank 0's measured steps, every round
  double comm_bytes_per_step = 0, states_mib = 0, activations_mib = 0;
};

// Bytes per step over rank 0's communicators: each distinct one among its process groups (the
// one-rank groups' SelfCommunicator keeps no log).
double comm_bytes(const Trainer& t) {
  std::vector<const Communicator*> seen;
  double bytes = 0;
  for (const ProcessGroup& g : t.groups().all()) {
    const Communicator* c = &g.comm();
    if (std::find(seen.begin(), seen.end(), c) != seen.end()) continue;
    seen.push_back(c);
    if (const CollectiveLog* log = c->collective_log()) {
      for (const auto& [op, totals] : log->totals()) bytes += static_cast<double>(totals.bytes);
    }
  }
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  log::init();
  CLI::App app{"zerod tensor-parallel step-time benchmark (T x DP against DP at one global batch)"};
  int world = 2, tensor = 2, expert = 1, stage = 0, steps = 6, warmup = 2, rounds = 2;
  bench::BenchShape shape;
  app.add_option("--world", world, "ranks (threads)")->capture_default_str();
  app.add_option("--tensor", tensor, "parallelism.tensor of the contender")->capture_default_str();
  app.add_option("--expert", expert,
                 "parallelism.expert of the contender, against 1 (with --experts; no tensor)")
      ->capture_default_str();
  app.add_option("--stage", stage, "ZeRO stage of both (over their data-parallel groups)")
      ->capture_default_str();
  std::vector<std::string> optimizers{"adamw"};
  app.add_option("--optimizer", optimizers, "adamw and/or muon (comma-separated)")
      ->delimiter(',')
      ->check(CLI::IsMember({"adamw", "muon"}))
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
    const bool moe = expert > 1;
    if (moe) {
      ZD_CHECK_INPUT(shape.experts > 0 && shape.experts % expert == 0 && world % expert == 0,
                     "--expert {} needs --experts (a multiple of it) and must divide --world {}",
                     expert, world);
      tensor = 1;
    } else {
      ZD_CHECK_INPUT(tensor > 1 && world % tensor == 0,
                     "--tensor {} must be > 1 and divide --world {}", tensor, world);
    }
    const int64_t global = int64_t{shape.batch} * world;  // sequences per step, both settings
    const bench::SyntheticData data(shape, global * (steps + warmup + 2));
    std::vector<Setting> settings;
    for (const std::string& optimizer : optimizers) {
      const std::string tail = optimizers.size() > 1 ? " " + optimizer : "";
      if (moe) {
        settings.push_back({"E=1" + tail, 1, 1, optimizer});
        settings.push_back({fmt::format("E={}", expert) + tail, 1, expert, optimizer});
      } else {
        settings.push_back({fmt::format("DP={}", world) + tail, 1, 1, optimizer});
        settings.push_back(
            {(world == tensor ? fmt::format("T={}", tensor)
                              : fmt::format("T={} x DP={}", tensor, world / tensor)) +
                 tail,
             tensor, 1, optimizer});
      }
    }
    fmt::print(
        "{} benchmark: world {} (threads, {} core(s)), {} {} layers{}, {} wide, {} "
        "heads, seq {}, vocab {}, {}, ZeRO stage {}; global batch {} sequences ({} tokens) a "
        "step; {} x ({} warm-up + {} measured steps) per setting\n",
        moe ? "expert-parallel" : "tensor-parallel", world, std::thread::hardware_concurrency(),
        shape.model, shape.layers,
        moe ? fmt::format(" ({} dropless experts, top-{})", shape.experts, shape.top_k) : "",
        shape.embd, shape.heads, shape.seq, shape.vocab, shape.dtype, stage, global,
        global * shape.seq, rounds, warmup, steps);
    for (int round = 0; round < rounds; ++round) {
      for (Setting& s : settings) {
        // The tensor group's ranks share one replica's data: its micro-batch is T times larger.
        bench::BenchShape run_shape = shape;
        run_shape.batch = shape.batch * s.tensor;
        const std::string extra =
            s.tensor > 1   ? fmt::format(R"(, "parallelism": {{"tensor": {}}})", s.tensor)
            : s.expert > 1 ? fmt::format(R"(, "parallelism": {{"expert": {}}})", s.expert)
                           : "";
        JobConfig job = bench::bench_job(run_shape, data, steps + warmup, world,
                                         fmt::format(R"({{"stage": {}}})", stage), extra);
        job.wall_clock_breakdown = false;
        if (s.optimizer == "muon") bench::use_muon(job);
        ZD_CHECK(job.global_batch() == global, "{}: global batch {}, expected {}", s.name,
                 job.global_batch(), global);
        std::mutex mu;
        LocalRanksOptions o;
        o.world_size = world;
        o.local_world_size = world;
        o.store = std::make_shared<MemoryStore>();
        o.store_prefix = fmt::format("tp_bench_{}_{}_{}", round, s.tensor, s.expert);
        run_local_ranks(o, [&](const RankContext& ctx) {
          TrainerOptions opts;
          opts.log_steps = false;
          Trainer t(job, ctx, opts);
          const TrainResult r = t.run();
          if (ctx.rank != 0) return;
          std::lock_guard<std::mutex> lock(mu);
          for (size_t i = static_cast<size_t>(warmup); i < r.steps.size(); ++i)
            s.seconds.push_back(r.steps[i].seconds);
          s.comm_bytes_per_step = comm_bytes(t) / static_cast<double>(r.steps.size());
          s.states_mib = static_cast<double>(t.engine().measured_bytes().states()) / (1 << 20);
          s.activations_mib =
              static_cast<double>(t.memory().peak(MemCategory::kActivations)) / (1 << 20);
        });
      }
    }
    fmt::print("{:>12} {:>10} {:>10} {:>12} {:>12} {:>14} {:>16} {:>14}\n", "setting", "micro-b.",
               "step ms", "tokens/s", "vs " + settings[0].name, "comm MB/step", "model states MiB",
               "activ. MiB");
    const auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    const double base = median(settings[0].seconds);
    for (const Setting& s : settings) {
      const double m = median(s.seconds);
      fmt::print("{:>12} {:>10} {:>10.1f} {:>12.0f} {:>12.2f} {:>14.2f} {:>16.1f} {:>14.1f}\n",
                 s.name, shape.batch * s.tensor, m * 1e3,
                 static_cast<double>(global * shape.seq) / m, m / base, s.comm_bytes_per_step / 1e6,
                 s.states_mib, s.activations_mib);
    }
    for (size_t i = 0; i + 1 < settings.size(); i += 2) {
      fmt::print("result: {} step time / {} step time = {:.2f} (median over {} steps each)\n",
                 settings[i + 1].name, settings[i].name,
                 median(settings[i + 1].seconds) / median(settings[i].seconds),
                 settings[i + 1].seconds.size());
    }
    for (size_t i = 2; i < settings.size(); ++i) {  // each optimizer against the first
      const Setting& against = settings[i % 2];
      fmt::print("result: {} step time / {} step time = {:.2f}; comm {:.2f} / {:.2f} MB/step\n",
                 settings[i].name, against.name,
                 median(settings[i].seconds) / median(against.seconds),
                 settings[i].comm_bytes_per_step / 1e6, against.comm_bytes_per_step / 1e6);
    }
  } catch (const InputError& e) {
    fmt::print(stderr, "zerod_tp_bench: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "zerod_tp_bench: {}\n", e.what());
    return 1;
  }
  return 0;
}
