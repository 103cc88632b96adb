// The /metrics endpoint (Prometheus text format; prometheus-cpp's registry and serializer, a
// small HTTP server of our own: see the .cc for why not its Exposer): per-rank gauges of the last
// step (loss, lr, grad norm, loss scale, tokens/s, MFU, memory) and counters (steps, skipped
// steps, checkpoints, collective calls, bytes and seconds by operation).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "engine/metrics/metrics_sink.h"

namespace zerod {

class PrometheusExporter : public MetricsSink {
 public:
  // Serves http://ADDRESS/metrics ("127.0.0.1:9400"; port 0: any free port). InputError
  // naming the address when it cannot listen. With a token, a scrape must carry
  // "Authorization: Bearer <token>" (401 otherwise; Prometheus: authorization.credentials_file).
  explicit PrometheusExporter(const std::string& address, std::string token = {});
  ~PrometheusExporter() override;
  int port() const;

  void on_step(int rank, const StepMetrics& m, const RankCounters& c) override;
  // A gauge without labels, registered at its first call (the elastic membership: zerod_elastic_*).
  void set_gauge(const std::string& name, const std::string& help, double value) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zerod
