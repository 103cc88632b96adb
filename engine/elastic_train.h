// `zerod train --nnodes MIN:MAX` (docs/elastic.md): the flags, the job checks that decide which
// node counts can train, and the agent's launch; and in a worker an agent started, its exit code
// for a stop and its membership gauges. The agent itself is engine/runtime/grpc/elastic_agent.h.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "engine/config/parse.h"
#include "engine/runtime/launch.h"

namespace zerod {

class PrometheusExporter;

struct ElasticFlags {
  int min_nodes = 1, max_nodes = 1;
  int max_restarts = 3;
  double settle_seconds = 5.0;
};

// "MIN:MAX" -> the range; nullopt for a plain count. InputError naming --nnodes when malformed.
std::optional<std::pair<int, int>> parse_nnodes_range(const std::string& text);

struct ElasticLaunch {
  ElasticFlags flags;
  LaunchSpec spec;                       // master, node rank (-1: assigned), nproc per node
  ParsedJob job;                         // not yet resolved
  std::string job_path;                  // "" for the demo job (refused: it has no checkpoint dir)
  std::vector<std::string> worker_args;  // "train", JOB, pass-through flags
  std::vector<std::string> global_args;  // --log-level
  std::string resume;
};

// The node counts in [MIN, MAX] whose world size can train the job, and for the others why not
// ("3 nodes: ..."). Pure: resolves copies of the job.
std::vector<int> admissible_node_counts(const JobConfig& unresolved, int min_nodes, int max_nodes,
                                        int nproc_per_node, std::vector<std::string>* refused);

// Runs the agent of this node; returns the exit code. InputError for a job that cannot run
// elastically (no checkpoint dir or save interval, no admissible node count, --listen).
int run_elastic_train(ElasticLaunch launch);

// In a worker started by an agent: true (and the gauges exported when `metrics` is set).
bool is_elastic_worker();
// "elastic epoch 2, node 1, nodes 0,1 (--nnodes 2:3), restarts 1/3" for the worker's log.
std::string elastic_worker_summary();
void publish_elastic_gauges(PrometheusExporter& metrics);

}  // namespace zerod
