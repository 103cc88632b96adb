// Runs this node's part of a job: its local ranks as threads (engine/runtime/local_ranks.h),
// each with a communicator bootstrapped through the node session's store and a Trainer. A peer
// that dies or fails makes every rank stop with Error(kPeerLost) naming it, at the latest at the
// next step boundary (sooner when a collective sees the broken connection).
#pragma once

#include <optional>
#include <string>

#include "engine/config/job_config.h"
#include "engine/runtime/node_session.h"
#include "engine/train/trainer.h"

namespace zerod {

struct RunJobOptions {
  bool log_steps = true;
  std::string bind_address;        // where this node's ranks listen; empty: the session's address
  std::string resume;              // "", "latest", "auto" or a checkpoint tag
  JobControl* control = nullptr;   // the daemon's commands and progress (not owned)
  MetricsSink* metrics = nullptr;  // every rank's per-step numbers (not owned)
  int threads_per_rank = 0;        // OpenMP threads of each rank; 0: cores / local ranks
  int local_processes = 1;         // zerod processes on this machine (launch.h)
  int local_process = 0;           // this one's index among them
};

struct JobOutcome {
  std::optional<TrainResult> rank0;  // global rank 0's result when this node runs it
  bool stopped = false;              // a stop request (SIGTERM/SIGUSR1) ended the job early
};

// The resolved job's hash, compared between nodes at join (FNV-1a 64 of its resolved JSON).
std::string job_hash(const JobConfig& cfg);

// Trains cfg (resolved for session.info().world_size) on this node's ranks.
JobOutcome run_job(const JobConfig& cfg, NodeSession& session, const RunJobOptions& options = {});

}  // namespace zerod
