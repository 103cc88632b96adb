// The training loop of one rank (DESIGN.md section 3): micro-batches with gradient
// accumulation, mixed precision with fp32 master weights, loss scaling, clipping, the LR
// schedule, periodic validation, the step line every steps_per_print and the CSV monitor.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "core/memory.h"
#include "engine/config/job_config.h"
#include "engine/metrics/csv_monitor.h"
#include "model/gpt.h"
#include "zero/zero_engine.h"

namespace zerod {

struct TrainResult {
  std::vector<StepMetrics> steps;
  std::optional<double> final_val_loss;
  int64_t tokens = 0;  // tokens trained on (all steps, all ranks)
  int64_t skipped_steps = 0;
  double seconds = 0;
  double peak_flops = 0;  // what MFU was measured against
  double data_seconds = 0, fwd_bwd_seconds = 0, optimizer_seconds = 0;  // whole run
};

struct TrainerOptions {
  bool log_steps = true;                            // the per-step line and summaries
  std::function<void(const StepMetrics&)> on_step;  // called after every step
};

class Trainer {
 public:
  // cfg must be resolved (resolve_job) for world size 1.
  explicit Trainer(JobConfig cfg, TrainerOptions options = {});
  ~Trainer();

  TrainResult run();

  // Mean validation loss over train.eval_batches micro-batches of the validation set (nullopt
  // when there is none).
  std::optional<double> evaluate();

  const JobConfig& config() const { return cfg_; }
  Gpt& model() { return *model_; }
  ZeroEngine& engine() { return *engine_; }
  MemoryTracker& memory() { return memory_; }

 private:
  struct Data;
  StepMetrics train_step(int64_t step);
  void log_step(const StepMetrics& m);
  void log_breakdown();

  JobConfig cfg_;
  TrainerOptions options_;
  MemoryTracker memory_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Gpt> model_;
  std::unique_ptr<ZeroEngine> engine_;
  std::unique_ptr<Data> data_;
  std::unique_ptr<CsvMonitor> csv_;
  double peak_flops_ = 0;
  int64_t steps_taken_ = 0;  // non-skipped optimizer steps (drives the LR schedule)
  int64_t skipped_ = 0;
  // Seconds in each phase over the whole run, and their values at the last breakdown print.
  struct PhaseTimes {
    double data = 0, fwd_bwd = 0, optim = 0;
  };
  PhaseTimes phases_, printed_phases_;
  int64_t breakdown_steps_ = 0;
};

}  // namespace zerod
