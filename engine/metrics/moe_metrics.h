// moe_metrics: what the mixture-of-experts layers routed in one optimizer step, over its
// micro-batches and the data-parallel ranks, for the step line and the monitors (CSV moe.csv,
// TensorBoard moe/..., Prometheus zerod_moe_...). Only models with experts have them.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/moe_spec.h"

namespace zerod {

class Communicator;

struct MoeLayerMetrics {
  int layer = 0;                // the model's block index
  std::vector<int64_t> tokens;  // (E) rows each expert computed, summed over the step
  int64_t assignments = 0;      // N k summed over the step: tokens + dropped
  int64_t dropped = 0;          // assignments dropped by the capacity
  double aux_loss = 0;          // this layer's own load-balancing loss (T = N), mean
  double z_loss = 0;            // this layer's z-loss, mean
  double dropped_fraction() const {
    return assignments > 0 ? static_cast<double>(dropped) / static_cast<double>(assignments) : 0.0;
  }
  // The busiest expert's rows over the mean per expert (1: balanced).
  double max_over_mean() const;
};

struct MoeMetrics {
  std::vector<MoeLayerMetrics> layers;
  double aux_loss = 0;   // the aux loss of the objective (MoeStepStats::aux_loss), mean
  double z_loss = 0;     // the summed z-losses of the objective, mean
  double objective = 0;  // aux_coef x aux + z_coef x z, mean
  int64_t dropped() const;
  int64_t assignments() const;
};

// Sums the micro-batches' MoeStepStats of one rank (add after each forward_backward), then
// reduce() over the ranks of `comm` (null: this rank alone): tokens and drops summed (divided by
// `replicas`, the ranks that route the same tokens alike: the tensor group), losses averaged over
// micro-batches x ranks, as the step's loss is.
class MoeMetricsAccumulator {
 public:
  explicit MoeMetricsAccumulator(int top_k) : top_k_(top_k) {}
  void add(const MoeStepStats& s);
  // Collective over comm when it is not null.
  MoeMetrics reduce(Communicator* comm, int world_size, int replicas = 1) const;

 private:
  int top_k_;
  int micro_ = 0;
  MoeMetrics sum_;
};

// The step line's part: " | moe aux A z Z drop D% load M" (load: the worst layer's busiest
// expert over the mean).
std::string moe_log_fields(const MoeMetrics& m);
// TensorBoard scalars: moe/aux_loss, moe/z_loss, moe/dropped_fraction, and per layer L
// moe/layerL/{aux_loss,z_loss,dropped_fraction,max_over_mean,expertE_tokens}.
std::vector<std::pair<std::string, float>> moe_scalars(const MoeMetrics& m);
// moe.csv: "step,layer,aux_loss,z_loss,dropped_fraction,tokens_0,...,tokens_{E-1}" and one row per
// MoE layer and a row "all" (the objective's aux and z losses, tokens summed over the layers).
std::string moe_csv_header(int experts);
std::vector<std::string> moe_csv_rows(int64_t step, const MoeMetrics& m);

}  // namespace zerod
