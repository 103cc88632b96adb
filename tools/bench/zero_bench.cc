// ZeRO step-time benchmark: the benchmark shape trained by `--world` ranks (threads of this
// process, Gloo over loopback) at each ZeRO stage, median step time per stage and its ratio to
// the first stage measured in the same run; with --offload, each offload setting at each stage
// and its ratio to the same stage without offload, also measured in the same run.
//
// With --device cuda the ranks are GPUs (one per rank, NCCL between them).
//
// --optimizer adamw,muon: each optimizer at each setting; the optimizer step's time per step
// (its exchange included) and the all_to_all bytes per step of rank 0 (comms logger totals, NCCL's
// size convention: the whole exchanged buffer; Muon's owner exchange is its only all_to_all) and
// all_gather bytes per step (Muon's stage-0 sharing; at stage 3 also the weight gathers).
//
//   zerod_zero_bench [--world 2] [--stages 0,1,2,3] [--steps 8] [--warmup 2] [--overlap]
//                    [--device cpu|cuda]
//                    [--offload none,opt-cpu,opt-nvme,param-cpu,param-nvme,all-nvme]
//                    [--optimizer adamw,muon]
//                    [--nvme-dir DIR] [--sub-group-size N] [--max-in-cpu N]
//                    [--comm-bytes 64M] [--comm-rounds 5] [--json]
//                    [shape flags as zerod_train_bench]
//
// In the same run it prints the two ratios of issue 21: ZeRO-3 step time / ZeRO-0 step time
// (with stages 0 and 3 among --stages, no offload, the first optimizer) and the Gloo
// communicator's all-reduce, reduce-scatter and all-gather bus bandwidth at world 2 (2 threads,
// as the ranks above) on --comm-bytes messages against a plain TCP stream between two threads
// on 127.0.0.1 measured right before them (tcp_stream.h), --comm-rounds times (medians of the
// rates and of the per-round ratios are reported). The ratio is taken against the
// two-direction stream: in each of these collectives both ranks send and receive the same bytes
// at once, which is what busbw counts; the one-direction rate is printed too. --json ends with
// one JSON line of all of it.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bench_job.h"
#include "collective_bw.h"
#include "comm/collective_log.h"
#include "comm/gloo/gloo_communicator.h"
#include "comm/store.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/runtime/local_ranks.h"
#include "engine/train/memory_preflight.h"
#include "engine/train/trainer.h"
#include "tcp_stream.h"

using namespace zerod;

namespace {

// Bus bandwidths (GB/s) at world 2 on `bytes` messages: the TCP stream between the two ranks'
// threads (1-dir, 2-dir) and each collective, on both paths of the Gloo backend between ranks of
// one process: over loopback TCP (its ring, what ranks in different processes use) and through
// shared memory (what GlooAlgorithm::kAuto picks between threads, comm/gloo/shared.cc); each
// collective's ratio to the 2-dir stream. `rounds` rounds, each measuring the stream right before
// the collectives (median iteration of each); reported: the median over rounds of each rate and of
// each ratio, so that a burst of other load on the shared machine skews one round, not the
// comparison.
constexpr const char* kPaths[] = {"tcp", "shared"};
struct CommRates {
  double tcp1 = 0, tcp2 = 0;
  double coll[2][3] = {};   // [path][collective in the order of bench::kCollectives]
  double ratio[2][3] = {};  // coll / tcp2, median over rounds
};

double median_of(std::vector<double> v) {
  return bench::summarize(std::move(v)).median;
}

CommRates measure_collectives(size_t bytes, int rounds) {
  constexpr int kRanks = 2;
  CommRates out;
  std::mutex mu;
  LocalRanksOptions o;
  o.world_size = kRanks;
  o.local_world_size = kRanks;
  o.store = std::make_shared<MemoryStore>();
  o.store_prefix = "collectives";
  run_local_ranks(o, [&](const RankContext& ctx) {
    ZD_CHECK(ctx.comm != nullptr, "rank {} has no communicator", ctx.rank);
    std::unique_ptr<Communicator> comms[2];
    for (int p = 0; p < 2; ++p) {
      GlooOptions g;
      g.rank = ctx.rank;
      g.size = kRanks;
      g.store = std::make_shared<PrefixStore>(std::string("collectives_") + kPaths[p], o.store);
      g.algorithm = p == 0 ? GlooAlgorithm::kRing : GlooAlgorithm::kShared;
      comms[p] = make_gloo_communicator(g);
    }
    std::vector<float> a(bytes / sizeof(float) + 1, 1.0f), b(bytes / sizeof(float) + 1, 0.0f);
    const int iters = bench::iterations_for(bytes);
    const double gb = static_cast<double>(bytes) / 1e9;
    bench::TcpStream stream(ctx.rank, *o.store, "collectives_tcp_stream");
    auto* src = reinterpret_cast<const char*>(a.data());
    auto* dst = reinterpret_cast<char*>(b.data());
    stream.one_direction(src, dst, bytes, 1);  // warm-up
    stream.two_directions(src, dst, bytes, 1);
    std::vector<double> tcp1, tcp2, coll[2][3], ratio[2][3];
    for (int round = 0; round < rounds; ++round) {
      tcp1.push_back(gb / stream.one_direction(src, dst, bytes, iters).median);
      tcp2.push_back(gb / stream.two_directions(src, dst, bytes, iters).median);
      for (int p = 0; p < 2; ++p) {
        for (size_t i = 0; i < 3; ++i) {
          const bench::Op op = bench::kCollectives[i];
          const bench::Timing t = bench::time_collective(*comms[p], op, a, b, bytes, iters);
          coll[p][i].push_back(gb / t.median * bench::bus_factor(op, kRanks));
          ratio[p][i].push_back(coll[p][i].back() / tcp2.back());
          if (round == 0) bench::check_collective(*comms[p], op, a, b, bytes);
        }
      }
    }
    if (ctx.rank != 0) return;
    std::lock_guard<std::mutex> lock(mu);
    out.tcp1 = median_of(tcp1);
    out.tcp2 = median_of(tcp2);
    for (int p = 0; p < 2; ++p) {
      for (size_t i = 0; i < 3; ++i) {
        out.coll[p][i] = median_of(coll[p][i]);
        out.ratio[p][i] = median_of(ratio[p][i]);
      }
    }
  });
  return out;
}

}  // namespace

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
  std::vector<std::string> offloads = {"none"};
  app.add_option("--offload", offloads,
                 "offload settings to compare at each stage: none, opt-cpu, opt-nvme (stages 1-3), "
                 "param-cpu, param-nvme, all-nvme (stage 3: optimizer and parameters on NVMe)")
      ->delimiter(',')
      ->check(CLI::IsMember({"none", "opt-cpu", "opt-nvme", "param-cpu", "param-nvme", "all-nvme"}))
      ->capture_default_str();
  std::string nvme_dir = "/tmp";
  app.add_option("--nvme-dir", nvme_dir, "nvme_path of the NVMe settings")->capture_default_str();
  int64_t sub_group = 100000000;
  app.add_option("--sub-group-size", sub_group, "zero_optimization.sub_group_size")
      ->capture_default_str();
  int64_t max_in_cpu = 0;
  app.add_option("--max-in-cpu", max_in_cpu,
                 "offload_param.max_in_cpu of param-nvme/all-nvme (elements kept in RAM)")
      ->capture_default_str();
  std::vector<std::string> optimizers = {"adamw"};
  app.add_option("--optimizer", optimizers, "optimizers to compare: adamw, muon")
      ->delimiter(',')
      ->check(CLI::IsMember({"adamw", "muon"}))
      ->capture_default_str();
  std::string device = "cpu";
  app.add_option("--device", device, "train.device of the ranks")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  std::string comm_bytes = "64M";
  app.add_option("--comm-bytes", comm_bytes,
                 "message size of the collectives-vs-TCP measurement at world 2 (0: skip it; "
                 "skipped unless given when --world is not 2)")
      ->capture_default_str();
  int comm_rounds = 5;
  app.add_option("--comm-rounds", comm_rounds,
                 "rounds of the collectives-vs-TCP measurement (medians over them)")
      ->capture_default_str();
  bool json = false;
  app.add_flag("--json", json, "end with one JSON line of the results");
  shape.add_options(app);
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::warn);
  try {
    const bench::SyntheticData data(shape, int64_t{shape.batch} * world * (steps + warmup + 2));
    fmt::print(
        "ZeRO benchmark: world {} (threads), {} layers, {} wide, seq {}, micro-batch {} per rank, "
        "vocab {}, {}, {}\n",
        world, shape.layers, shape.embd, shape.seq, shape.batch, shape.vocab, shape.dtype, device);
    fmt::print(
        "{:>5} {:>10} {:>6} {:>10} {:>10} {:>14} {:>12} {:>10} {:>12} {:>16} {:>9} {:>12} {:>12} "
        "{:>12} "
        "{:>12}\n",
        "stage", "offload", "optim", "step ms", "tokens/s", "comm wait ms", "offload I/O",
        "vs first", "vs no offl.", "model states MiB", "optim ms", "a2a B/step", "ag B/step",
        "tracked MiB", "planned MiB");
    double first = 0;
    std::map<int, double> plain;  // stage -> median step seconds (no offload, first optimizer)
    std::string rows_json;
    for (int stage : stages) {
      double none = 0;
      for (const std::string& off : offloads)
        for (const std::string& optimizer : optimizers) {
          const bool opt = off == "opt-cpu" || off == "opt-nvme" || off == "all-nvme";
          const bool param = off == "param-cpu" || off == "param-nvme" || off == "all-nvme";
          if ((opt && stage == 0) || (param && stage != 3)) continue;  // (not valid there)
          const bool nvme = off.find("nvme") != std::string::npos;
          const std::string dev = nvme ? "nvme" : "cpu";
          const std::string path = nvme ? fmt::format(R"(, "nvme_path": "{}")", nvme_dir) : "";
          std::string zero = fmt::format(R"({{"stage": {}, "sub_group_size": {}{})", stage,
                                         sub_group, overlap ? R"(, "overlap_comm": true)" : "");
          if (opt)
            zero += fmt::format(R"(, "offload_optimizer": {{"device": "{}"{}, "pipeline_read": true,
                                 "pipeline_write": true}})",
                                dev, path);
          if (param)
            zero += fmt::format(R"(, "offload_param": {{"device": "{}"{}{}}})", dev, path,
                                nvme ? fmt::format(R"(, "max_in_cpu": {})", max_in_cpu) : "");
          zero += "}";
          JobConfig job = bench::bench_job(shape, data, steps + warmup, world, zero);
          if (optimizer == "muon") bench::use_muon(job);  // (AdamW for the other tensors)
          if (device == "cuda") {
            job.train.device = TrainDevice::kCuda;
            job.wall_clock_breakdown = false;  // (it synchronizes the GPU around every op)
          }
          std::mutex mu;
          std::vector<double> seconds;
          double comm = 0, io = 0, states = 0, optim = 0, tracked = 0, planned = 0;
          int64_t a2a = 0, ag = 0;
          LocalRanksOptions o;
          o.world_size = world;
          o.local_world_size = world;
          o.store = std::make_shared<MemoryStore>();
          o.store_prefix = fmt::format("stage{}_{}_{}", stage, off, optimizer);
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
            io = r.offload_io_seconds / static_cast<double>(r.steps.size());
            states = static_cast<double>(t.engine().measured_bytes().states()) / (1 << 20);
            optim = r.optimizer_seconds / static_cast<double>(r.steps.size());
            // Rank 0's tracked peak (every category) against its plan row (engine/plan).
            tracked = static_cast<double>(t.memory().total_peak()) / (1 << 20);
            const Plan plan = make_plan(job_plan_request(
                job, t.model().spec(), static_cast<int>(t.backend().compute_elem_size())));
            if (const PlanRow* row = job_plan_row(plan, job))
              planned = static_cast<double>(row->device + row->host) / (1 << 20);
            if (const CollectiveLog* log = ctx.comm ? ctx.comm->collective_log() : nullptr) {
              const auto totals = log->totals();
              const auto it = totals.find("all_to_all");
              if (it != totals.end()) a2a = it->second.bytes / static_cast<int64_t>(r.steps.size());
              const auto g = totals.find("all_gather");
              if (g != totals.end()) ag = g->second.bytes / static_cast<int64_t>(r.steps.size());
            }
          });
          std::sort(seconds.begin(), seconds.end());
          const double median = seconds[seconds.size() / 2];
          if (first == 0) first = median;
          if (off == "none" && optimizer == optimizers.front()) none = plain[stage] = median;
          rows_json += fmt::format(
              R"({}{{"stage": {}, "offload": "{}", "optimizer": "{}", "step_ms": {:.1f}, "tokens_per_s": {:.0f}, "comm_wait_ms": {:.1f}, "tracked_mib": {:.1f}, "planned_mib": {:.1f}}})",
              rows_json.empty() ? "" : ", ", stage, off, optimizer, median * 1e3,
              double(shape.batch) * world * shape.seq / median, comm * 1e3, tracked, planned);
          fmt::print(
              "{:>5} {:>10} {:>6} {:>10.1f} {:>10.0f} {:>14.1f} {:>12.1f} {:>10.2f} {:>12} "
              "{:>16.1f} "
              "{:>9.1f} {:>12} {:>12} {:>12.1f} {:>12.1f}\n",
              stage, off, optimizer, median * 1e3, double(shape.batch) * world * shape.seq / median,
              comm * 1e3, io * 1e3, median / first,
              none > 0 ? fmt::format("{:.2f}", median / none) : std::string("-"), states,
              optim * 1e3, a2a, ag, tracked, planned);
        }
    }
    std::string ratio_json = "null";
    if (plain.count(0) && plain.count(3)) {
      const double ratio = plain[3] / plain[0];
      ratio_json = fmt::format("{:.3f}", ratio);
      fmt::print(
          "\nZeRO-3 / ZeRO-0 step time at world {}: {:.3f} ({:.1f} / {:.1f} ms; target <= 1.25: "
          "{})\n",
          world, ratio, plain[3] * 1e3, plain[0] * 1e3, ratio <= 1.25 ? "met" : "MISSED");
    }
    std::string comm_json = "null";
    const size_t bytes = world == 2 || app.count("--comm-bytes") > 0
                             ? bench::parse_message_bytes(comm_bytes, "--comm-bytes")
                             : 0;
    if (bytes > 0) {
      ZD_CHECK_INPUT(bytes >= 64, "--comm-bytes {}: at least 64 bytes", comm_bytes);
      ZD_CHECK_INPUT(comm_rounds >= 1, "--comm-rounds {}: at least 1", comm_rounds);
      const CommRates c = measure_collectives(bytes, comm_rounds);
      fmt::print(
          "\nCollectives at world 2 (threads), {} byte messages, GB/s (1e9 B/s; median iteration, "
          "median of {} rounds): TCP stream 1-dir {:.3f}, 2-dir {:.3f} per direction\n",
          bytes, comm_rounds, c.tcp1, c.tcp2);
      comm_json = fmt::format(
          R"({{"bytes": {}, "rounds": {}, "tcp_1dir_gbs": {:.3f}, "tcp_2dir_gbs": {:.3f})", bytes,
          comm_rounds, c.tcp1, c.tcp2);
      for (int p = 0; p < 2; ++p) {
        fmt::print("  {}\n", p == 0 ? "Gloo over loopback TCP (ring; ranks in other processes)"
                                    : "Gloo through shared memory (ranks in this process: the "
                                      "default between threads)");
        // (JSON: the TCP path's keys as before; the shared path's prefixed "shared_".)
        const std::string prefix = p == 0 ? "" : "shared_";
        for (size_t i = 0; i < 3; ++i) {
          const double ratio = c.ratio[p][i];
          const char* name = bench::op_name(bench::kCollectives[i]);
          fmt::print(
              "    {:<15} busbw {:.3f} GB/s = {:.0f}% of TCP 2-dir ({:.0f}% of 1-dir); target >= "
              "70%: {}\n",
              name, c.coll[p][i], 100 * ratio, 100 * c.coll[p][i] / c.tcp1,
              ratio >= 0.70 ? "met" : "MISSED");
          comm_json += fmt::format(R"(, "{}{}_gbs": {:.3f}, "{}{}_vs_tcp": {:.3f})", prefix, name,
                                   c.coll[p][i], prefix, name, ratio);
        }
      }
      comm_json += "}";
    }
    if (json) {
      fmt::print(
          R"({{"world": {}, "layers": {}, "embd": {}, "heads": {}, "seq": {}, "batch": {}, "vocab": {}, "dtype": "{}", "rows": [{}], "zero3_over_zero0": {}, "collectives": {}}})"
          "\n",
          world, shape.layers, shape.embd, shape.heads, shape.seq, shape.batch, shape.vocab,
          shape.dtype, rows_json, ratio_json, comm_json);
    }
  } catch (const InputError& e) {
    fmt::print(stderr, "zerod_zero_bench: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "zerod_zero_bench: {}\n", e.what());
    return 1;
  }
  return 0;
}
