// Where a rank's per-step numbers go besides the step line and the monitors: the Prometheus
// endpoint (prometheus_exporter.h). No dependency on any metrics library.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "comm/collective_log.h"
#include "engine/metrics/csv_monitor.h"

namespace zerod {

struct RankCounters {
  int64_t memory_bytes = 0, memory_peak_bytes = 0;
  int64_t steps = 0, skipped_steps = 0, checkpoints = 0;  // totals of this run
  std::map<std::string, CollectiveTotals> collectives;    // by operation kind
};

class MetricsSink {
 public:
  virtual ~MetricsSink() = default;
  // Called by every rank after each step (concurrently from the ranks of one process).
  virtual void on_step(int rank, const StepMetrics& m, const RankCounters& c) = 0;
  // A job-level value outside the steps (the elastic membership, the steps a failure lost);
  // sinks without gauges ignore it.
  virtual void set_gauge(const std::string& name, const std::string& help, double value) {
    (void)name, (void)help, (void)value;
  }
};

}  // namespace zerod
