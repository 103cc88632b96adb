// Checkpoint benchmark: save and load throughput of zerod's checkpoints against `dd` writing and
// reading the same number of bytes on the same disk in the same run, and the time training is
// blocked by an async save against a synchronous one. How much an async save blocks depends on
// how long a step takes against how long the write takes: pick --seq/--batch for the step time
// of the training to compare with (the default, 4 x 256 tokens of GPT-2 124M, takes about half
// a second on two cores; a typical 8 x 1024 micro-batch takes several).
//
// Both sides get a warm-up run first: on VMs whose memory is backed lazily, the first use of
// fresh memory is several times slower than steady state and would be charged to whoever runs
// first. Loads are measured from disk (the files evicted from the page cache with
// posix_fadvise(DONTNEED), as after a restart).
//
//   zerod_checkpoint_bench [--dir DIR] [--world N] [--stage S] [shape flags; GPT-2 124M default]
#include <fcntl.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <mutex>

#include "bench_job.h"
#include "comm/store.h"
#include "core/log.h"
#include "core/timer.h"
#include "engine/runtime/local_ranks.h"
#include "engine/train/trainer.h"

using namespace zerod;
namespace fs = std::filesystem;

namespace {

double time_command(const std::string& cmd) {
  Stopwatch sw;
  if (std::system((cmd + " >/dev/null 2>&1").c_str()) != 0) return -1;
  return sw.seconds();
}

// Drops the page-cache copy of every file under path.
void evict(const fs::path& path) {
  for (const auto& e : fs::recursive_directory_iterator(path)) {
    if (!e.is_regular_file()) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

}  // namespace

int main(int argc, char** argv) {
  log::init();
  CLI::App app{"zerod checkpoint benchmark"};
  std::string dir = "zerod-ckpt-bench";
  int world = 1, stage = 0;
  bench::BenchShape shape;
  shape.layers = 12;
  shape.embd = 768;
  shape.heads = 12;
  shape.seq = 256;
  shape.batch = 4;
  app.add_option("--dir", dir, "a directory on the disk to measure (removed afterwards)")
      ->capture_default_str();
  app.add_option("--world", world, "ranks (threads)")->capture_default_str();
  app.add_option("--stage", stage, "ZeRO stage")->capture_default_str();
  shape.add_options(app);
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::warn);
  fs::create_directories(dir);
  const bench::SyntheticData data(shape, int64_t{shape.batch} * world * 8);
  const fs::path ckpt = fs::path(dir) / "ckpt";

  struct Times {
    double save = 0, sync_blocked = 0, load = 0;
    double async_blocked = 0, async_steps = 0, plain_steps = 0, step = 0;
  } t;
  std::mutex mu;
  auto job = [&](bool async) {
    const std::string zero = fmt::format(R"({{"stage": {}}}, "checkpoint": {{"async": {}}})", stage,
                                         async ? "true" : "false");
    JobConfig cfg = bench::bench_job(shape, data, 1, world, zero);
    cfg.train.checkpoint_dir = ckpt.string();
    return cfg;
  };
  auto ranks = [&](const JobConfig& cfg, const std::function<void(Trainer&, int)>& body) {
    LocalRanksOptions o;
    o.world_size = world;
    o.local_world_size = world;
    o.store = std::make_shared<MemoryStore>();
    run_local_ranks(o, [&](const RankContext& ctx) {
      TrainerOptions opts;
      opts.log_steps = false;
      Trainer tr(cfg, ctx, opts);
      body(tr, ctx.rank);
    });
  };
  // Synchronous saves: a warm-up, then the measured one.
  ranks(job(false), [&](Trainer& tr, int rank) {
    tr.run();  // one step: real optimizer states
    tr.save_checkpoint("warmup");
    // Its page-cache pages are freed for the next save to reuse, as dd's warm-up file is
    // truncated and rewritten below.
    if (rank == 0) fs::remove_all(ckpt / "warmup");
    Stopwatch sw;
    const SaveReport r = tr.save_checkpoint("sync");
    if (rank == 0) {
      t.save = sw.seconds();
      t.sync_blocked = r.blocked_seconds;
    }
  });
  const int64_t bytes = read_manifest((ckpt / "sync").string()).total_bytes();
  // Loads of "sync" (latest), from disk: the files are evicted from the page cache first (zerod
  // reads them with O_DIRECT, so it would not use a cached copy anyway).
  evict(ckpt);
  ranks(job(false), [&](Trainer& tr, int rank) {
    Stopwatch sw;
    tr.resume("latest");
    if (rank == 0) t.load = sw.seconds();
  });
  // Async saves inside training: 12 steps, a save every 4 (steps 4, 8 and 12). Training is
  // blocked in save() and in the optimizer steps that reach units the writer has not (copies) or
  // is writing (waits). The same steps without saves show what the background write costs the
  // steps around it (two cores shared with the writer), per save.
  for (bool saving : {false, true}) {
    JobConfig cfg = job(true);
    cfg.train.steps = 12;
    if (saving)
      cfg.train.save_interval = 4;
    else
      cfg.train.checkpoint_dir.clear();
    ranks(cfg, [&](Trainer& tr, int rank) {
      const TrainResult r = tr.run();
      if (rank != 0) return;
      double step_seconds = 0;
      for (const auto& m : r.steps) step_seconds += m.seconds;
      (saving ? t.async_steps : t.plain_steps) = step_seconds;
      if (saving) t.async_blocked = r.checkpoint_blocked_seconds / 3;
      t.step = step_seconds / static_cast<double>(r.steps.size());
    });
  }

  const std::string ddfile = (fs::path(dir) / "dd.bin").string();
  const int64_t count = std::max<int64_t>(1, bytes >> 20);
  const std::string dd_write =
      fmt::format("dd if=/dev/zero of={} bs=1M count={} conv=fsync", ddfile, count);
  time_command(dd_write);  // warm-up
  const double dd_w = time_command(dd_write);
  evict(dir);
  const double dd_r = time_command(fmt::format("dd if={} of=/dev/null bs=1M", ddfile));
  fs::remove_all(dir);

  const double mb = static_cast<double>(bytes) / 1e6;
  const double dd_mb = static_cast<double>(count) * (1 << 20) / 1e6;
  fmt::print(
      "checkpoint benchmark: {} layers x {} wide, world {}, ZeRO stage {}: {:.1f} MB of optimizer "
      "states\n",
      shape.layers, shape.embd, world, stage, mb);
  fmt::print(
      "save (sync, fsync'd, committed): {:.0f} MB/s | dd write conv=fsync: {:.0f} MB/s | ratio "
      "{:.2f}\n",
      mb / t.save, dd_mb / dd_w, (mb / t.save) / (dd_mb / dd_w));
  fmt::print(
      "load (read shards, verify checksums): {:.0f} MB/s | dd read (page cache evicted): {:.0f} "
      "MB/s | ratio {:.2f}\n",
      mb / t.load, dd_mb / dd_r, (mb / t.load) / (dd_mb / dd_r));
  fmt::print(
      "training blocked per save: sync {:.3f} s | async {:.3f} s ({:.1f}% of sync); "
      "{:.2f} s per step; steps slower by {:.3f} s per async save ({:.1f}% of sync)\n",
      t.sync_blocked, t.async_blocked, 100.0 * t.async_blocked / t.sync_blocked, t.step,
      (t.async_steps - t.plain_steps) / 3,
      100.0 * (t.async_steps - t.plain_steps) / 3 / t.sync_blocked);
  return 0;
}
