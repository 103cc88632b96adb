#include "engine/train/run_job.h"

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "core/error.h"
#include "engine/config/parse.h"
#include "engine/runtime/local_ranks.h"
#include "engine/train/memory_snapshot.h"

namespace zerod {

std::string job_hash(const JobConfig& cfg) {
  const std::string text = job_to_json(cfg).dump();
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return fmt::format("{:016x}", h);
}

JobOutcome run_job(const JobConfig& cfg, NodeSession& session, const RunJobOptions& options) {
  const NodeInfo& info = session.info();
  ZD_CHECK(cfg.world_size == info.world_size, "job resolved for world {} but the session has {}",
           cfg.world_size, info.world_size);
  LocalRanksOptions o;
  o.world_size = info.world_size;
  o.first_rank = info.first_rank;
  o.local_world_size = info.nproc_per_node;
  o.threads_per_rank = options.threads_per_rank;
  o.local_processes = options.local_processes;
  o.local_process = options.local_process;
  o.store = session.store();
  o.monitor = session.monitor();
  o.timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.train.collective_timeout * 1000));
  if (!options.bind_address.empty()) {
    o.bind_address = options.bind_address;
  } else if (static_cast<size_t>(info.node_rank) < info.nodes.size() &&
             !info.nodes[static_cast<size_t>(info.node_rank)].address.empty()) {
    o.bind_address = info.nodes[static_cast<size_t>(info.node_rank)].address;
  }
  std::mutex mu;
  JobOutcome outcome;
  run_local_ranks(o, [&](const RankContext& ctx) {
    TrainerOptions topts;
    topts.log_steps = options.log_steps;
    topts.control = options.control;
    topts.metrics = options.metrics;
    // Between steps every rank asks whether a peer node died, so a failure elsewhere stops
    // this node even when none of its collectives is waiting on the dead peer.
    topts.on_step = [&session](const StepMetrics&) { session.check_world(); };
    Trainer trainer(cfg, ctx, topts);
    // An elastic worker restores from its nodes' in-memory snapshots when one is newer than the
    // disk checkpoint (memory_snapshot.h).
    const std::unique_ptr<MemorySnapshots> snapshots =
        make_memory_snapshots(cfg, ctx, info.nproc_per_node);
    std::optional<SnapshotRestore> restore;
    if (snapshots && !options.resume.empty())
      restore = snapshots->prepare_restore(cfg.train.checkpoint_dir);
    if (restore) {
      trainer.resume_from_dir(restore->dir);
    } else if (!options.resume.empty()) {
      trainer.resume(options.resume);
    }
    if (snapshots && ctx.rank == 0 && options.metrics) {
      if (const auto lost = snapshots->steps_lost()) {
        const char* before = std::getenv("ZEROD_ELASTIC_STEPS_LOST_TOTAL");
        options.metrics->set_gauge("zerod_elastic_steps_lost",
                                   "Steps the last failure lost (trained again after its restore)",
                                   static_cast<double>(*lost));
        options.metrics->set_gauge("zerod_elastic_steps_lost_total",
                                   "Steps lost to failures over the job (trained again)",
                                   static_cast<double>(*lost) + (before ? std::atof(before) : 0.0));
      }
    }
    trainer.set_snapshots(snapshots.get());
    TrainResult r = trainer.run();
    std::lock_guard<std::mutex> lock(mu);
    outcome.stopped = outcome.stopped || r.stopped;
    if (ctx.rank == 0) outcome.rank0 = std::move(r);
  });
  return outcome;
}

}  // namespace zerod
