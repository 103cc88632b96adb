// The elastic agent of one node (zerod train --nnodes MIN:MAX, docs/elastic.md): hosts the
// ElasticRendezvous when it is node 0, joins rounds, runs each round's worker as a child zerod
// (the static multi-node path: `zerod train JOB --nnodes N --node-rank R --master ROUND`), and
// restarts it when the membership changes, torchrun-elastic-agent style.
//
// The worker learns from ZEROD_ELASTIC_* variables that an agent runs it: it exits
// kWorkerStoppedExit (not 0) when it stopped at an agreed step with a save, so that the agent
// tells a stop from the end of the job; it exports the membership as Prometheus gauges.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "engine/runtime/elastic_registry.h"
#include "engine/runtime/grpc/elastic_service.h"

namespace zerod {

// A worker run by an agent that stopped at an agreed step after its save.
constexpr int kWorkerStoppedExit = 10;
// Set (to "1") in the worker's environment by its agent.
constexpr const char* kElasticAgentEnv = "ZEROD_ELASTIC_AGENT";

struct ElasticAgentOptions {
  std::string master_host;
  int master_port = 0;
  int node_rank = -1;  // -1: hosts the rendezvous if it can bind --master, rank assigned
  ElasticConfig config;
  ElasticStatusInfo status;  // node 0's zeroctl status
  // The worker's command line after the zerod binary, without --nnodes/--node-rank/--master/
  // --resume/--nproc-per-node, which the agent adds per round ("train", "JOB", "--steps", ...).
  std::vector<std::string> worker_args;
  std::vector<std::string> global_args;  // before "train" ("--log-level", "debug")
  std::string resume;                    // the first round's --resume ("" none); later: auto
  std::chrono::milliseconds first_round_timeout{300000};
  // snapshot.enabled: the memory file system (snapshot.dir) where this agent keeps its node's
  // in-memory snapshots (a directory of its own, removed when it exits); "" none.
  std::string snapshot_root;
  // The host lease (elastic_host_lease.h) in the job's checkpoint directory: how a lost
  // rendezvous host is taken over by the next live node ("" never: the job ends with node 0).
  std::string lease_path;
  // The job failed (below MIN, restarts used up): saves the node's newest in-memory snapshot
  // into the checkpoint directory when it holds every rank's files and is newer than the disk
  // checkpoint (memory_snapshot.h save_held_snapshot); returns the log line ("" nothing saved).
  // Called by the rendezvous host's agent only (one save per job).
  std::function<std::string(const std::string& node_dir)> save_snapshot;
};

// Runs the agent until the job ends; returns the process exit code: 0 finished or stopped on
// request, 2 refused or a bad job, 3 the job failed (lost below MIN, restarts used up, the
// rendezvous host lost).
int run_elastic_agent(const ElasticAgentOptions& options);

}  // namespace zerod
