#include "engine/elastic_train.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <cstdlib>

#include "core/error.h"
#include "engine/checkpoint/checkpoint_dir.h"
#include "engine/train/job_environment.h"
#include "engine/train/memory_snapshot.h"
#include "engine/train/run_job.h"

#ifdef ZEROD_HAVE_PROMETHEUS
#include "engine/metrics/prometheus_exporter.h"
#endif
#ifdef ZEROD_HAVE_GRPC
#include "engine/runtime/elastic_host_lease.h"
#include "engine/runtime/grpc/elastic_agent.h"
#endif

namespace zerod {

std::optional<std::pair<int, int>> parse_nnodes_range(const std::string& text) {
  const auto colon = text.find(':');
  if (colon == std::string::npos) return std::nullopt;
  auto number = [&](const std::string& part) {
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (part.empty() || used != part.size() || v < 1) {
      ZD_THROW_INPUT("--nnodes {}: MIN:MAX must be two positive node counts (e.g. 2:4)", text);
    }
    return v;
  };
  const int lo = number(text.substr(0, colon));
  const int hi = number(text.substr(colon + 1));
  if (lo > hi) ZD_THROW_INPUT("--nnodes {}: MIN {} is above MAX {}", text, lo, hi);
  return std::make_pair(lo, hi);
}

std::vector<int> admissible_node_counts(const JobConfig& unresolved, int min_nodes, int max_nodes,
                                        int nproc_per_node, std::vector<std::string>* refused) {
  std::vector<int> ok;
  for (int n = min_nodes; n <= max_nodes; ++n) {
    JobConfig c = unresolved;
    try {
      resolve_job(c, n * nproc_per_node);
      check_supported(c);
      ok.push_back(n);
    } catch (const std::exception& e) {
      if (refused)
        refused->push_back(
            fmt::format("{} node(s), world size {}: {}", n, n * nproc_per_node, e.what()));
    }
  }
  return ok;
}

bool is_elastic_worker() {
  return std::getenv("ZEROD_ELASTIC_AGENT") != nullptr;
}

std::string elastic_worker_summary() {
  if (std::getenv("ZEROD_ELASTIC_AGENT") == nullptr) return "";
  auto get = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v ? v : "?");
  };
  return fmt::format("elastic epoch {}, node {}, nodes {} (--nnodes {}:{}), restarts {}/{}",
                     get("ZEROD_ELASTIC_EPOCH"), get("ZEROD_ELASTIC_NODE_RANK"),
                     get("ZEROD_ELASTIC_NODES"), get("ZEROD_ELASTIC_MIN_NODES"),
                     get("ZEROD_ELASTIC_MAX_NODES"), get("ZEROD_ELASTIC_RESTARTS"),
                     get("ZEROD_ELASTIC_MAX_RESTARTS"));
}

void publish_elastic_gauges(PrometheusExporter& metrics) {
#ifdef ZEROD_HAVE_PROMETHEUS
  if (!is_elastic_worker()) return;
  auto number = [](const char* name) {
    const char* v = std::getenv(name);
    return v ? std::atof(v) : 0.0;
  };
  double nodes = 0;
  if (const char* v = std::getenv("ZEROD_ELASTIC_NODES"); v && *v) {
    nodes = 1;
    for (const char* c = v; *c; ++c) nodes += *c == ',' ? 1 : 0;
  }
  metrics.set_gauge("zerod_elastic_epoch", "Membership epoch (rounds formed so far)",
                    number("ZEROD_ELASTIC_EPOCH"));
  metrics.set_gauge("zerod_elastic_nodes", "Nodes in the current round", nodes);
  metrics.set_gauge("zerod_elastic_min_nodes", "--nnodes MIN", number("ZEROD_ELASTIC_MIN_NODES"));
  metrics.set_gauge("zerod_elastic_max_nodes", "--nnodes MAX", number("ZEROD_ELASTIC_MAX_NODES"));
  metrics.set_gauge("zerod_elastic_restarts", "Rounds ended by a failure so far",
                    number("ZEROD_ELASTIC_RESTARTS"));
  metrics.set_gauge("zerod_elastic_max_restarts", "--max-restarts",
                    number("ZEROD_ELASTIC_MAX_RESTARTS"));
  metrics.set_gauge("zerod_elastic_steps_lost_total",
                    "Steps lost to failures over the job (trained again)",
                    number("ZEROD_ELASTIC_STEPS_LOST_TOTAL"));
  metrics.set_gauge("zerod_elastic_last_recovery_seconds",
                    "The last failure's detection to its new round (0: none)",
                    number("ZEROD_ELASTIC_LAST_RECOVERY_SECONDS"));
#else
  (void)metrics;
#endif
}

int run_elastic_train(ElasticLaunch l) {
  const ElasticFlags& f = l.flags;
  JobConfig& cfg = l.job.config;
  const std::string what = fmt::format("--nnodes {}:{}", f.min_nodes, f.max_nodes);
  // In-memory snapshots (snapshot.enabled) stand in for the save interval; a join still saves
  // to train.checkpoint_dir.
  if (cfg.train.checkpoint_dir.empty() || (cfg.train.save_interval <= 0 && !cfg.snapshot.enabled)) {
    ZD_THROW_INPUT(
        "{}: an elastic job resumes from its checkpoints when its membership changes: set "
        "train.checkpoint_dir (a directory every node reaches at the same path) and "
        "train.save_interval (or snapshot.enabled with snapshot.interval)",
        what);
  }
  const int nproc = l.spec.nproc_per_node;
  std::vector<std::string> refused;
  const std::vector<int> counts =
      admissible_node_counts(cfg, f.min_nodes, f.max_nodes, nproc, &refused);
  if (counts.empty()) {
    ZD_THROW_INPUT("{}: no node count in the range can train this job:\n  {}", what,
                   fmt::join(refused, "\n  "));
  }
  for (const auto& r : refused) spdlog::warn("elastic: not admissible: {}", r);
  // Resolved at the largest admissible world: every node of the job hashes it alike.
  JobConfig resolved = cfg;
  resolve_job(resolved, counts.back() * nproc);
  check_job_environment(resolved, {.local_ranks = nproc});
#ifdef ZEROD_HAVE_GRPC
  ElasticAgentOptions o;
  o.master_host = l.spec.master_host;
  o.master_port = l.spec.master_port;
  o.node_rank = l.spec.node_rank;
  o.config.job_hash = job_hash(resolved);
  o.config.nproc_per_node = nproc;
  o.config.min_nodes = f.min_nodes;
  o.config.max_nodes = f.max_nodes;
  o.config.admissible = counts;
  o.config.settle = std::chrono::milliseconds(static_cast<int64_t>(f.settle_seconds * 1000));
  o.config.below_min_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(cfg.train.rendezvous_timeout * 1000));
  o.config.max_restarts = f.max_restarts;
  o.config.master_host = l.spec.master_host;
  o.first_round_timeout = o.config.below_min_timeout;
  o.status.job_name = l.job_path;
  o.status.total_steps = cfg.train.steps;
  o.status.latest_checkpoint = [dir = cfg.train.checkpoint_dir]() -> std::string {
    try {
      return read_latest(dir).value_or("");
    } catch (const std::exception&) {
      return "";
    }
  };
  o.worker_args = std::move(l.worker_args);
  o.global_args = std::move(l.global_args);
  o.resume = l.resume;
  if (cfg.snapshot.enabled) o.snapshot_root = cfg.snapshot.dir;
  o.lease_path = ElasticHostLease::path_in(cfg.train.checkpoint_dir);
  o.save_snapshot = [dir = cfg.train.checkpoint_dir](const std::string& node_dir) {
    return save_held_snapshot(node_dir, dir);
  };
  spdlog::info(
      "elastic: {} (admissible node counts {}), node {}, rendezvous {}, --max-restarts "
      "{}, settle {:g} s, config hash {}",
      what, fmt::join(counts, ", "),
      l.spec.node_rank < 0 ? std::string("?") : std::to_string(l.spec.node_rank),
      l.spec.master_address(), f.max_restarts, f.settle_seconds, o.config.job_hash);
  return run_elastic_agent(o);
#else
  ZD_THROW_INPUT("{}: this zerod was built without gRPC, which elastic training needs", what);
#endif
}

}  // namespace zerod
