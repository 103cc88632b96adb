// csv_monitor: OUTPUT_PATH/JOB_NAME/metrics.csv, one row per optimizer step.
// Columns: step,loss,lr,grad_norm,loss_scale,tokens_per_s,mfu,skipped,val_loss (val_loss empty
// on steps without a validation pass). Losses carry 9 significant digits. A model with experts
// also gets OUTPUT_PATH/JOB_NAME/moe.csv (moe_metrics.h: per MoE layer and step, tokens per
// expert, the dropped fraction, the aux and z losses), kept and resumed as metrics.csv.
//
// Runs never overwrite each other's metrics. A fresh run writes into the first of
// OUTPUT_PATH/JOB_NAME, JOB_NAME_1, JOB_NAME_2, ... that does not exist or is empty (its "run
// number" 0, 1, 2, ...); the checkpoints it saves record that number, and a run resumed from one
// of them appends to the same directory's metrics.csv (next_monitor_run, monitor_run_dir).
#pragma once

#include <cstdio>
#include <optional>
#include <string>

#include "engine/config/job_config.h"
#include "engine/metrics/moe_metrics.h"

namespace zerod {

struct StepMetrics {
  int64_t step = 0;  // 1-based optimizer step (skipped steps count, as in DeepSpeed)
  double loss = 0;   // mean training loss over the step's micro-batches
  double lr = 0;
  double grad_norm = 0;  // unscaled global norm before clipping (inf on overflow)
  double loss_scale = 1;
  double tokens_per_s = 0;
  double mfu = 0;        // fraction of peak FLOP/s
  bool skipped = false;  // fp16 overflow: no update
  std::optional<double> val_loss;
  double seconds = 0;  // wall time of the step
  // Pipeline parallelism: the fraction of the step the pipeline ranks spent outside compute
  // (waiting in receives, idle), measured on each rank and averaged over the world.
  std::optional<double> pipeline_bubble;
  // Models with experts: the step's routing and router losses over micro-batches and ranks.
  std::optional<MoeMetrics> moe;
};

// Where a monitor writes: OUTPUT_PATH/JOB_NAME ("." when output_path is empty), as DeepSpeed's
// monitors lay it out.
std::string monitor_dir(const MonitorConfig& config);
// Run `run` of the monitor: monitor_dir for 0, OUTPUT_PATH/JOB_NAME_<run> after it.
std::string monitor_run_dir(const MonitorConfig& config, int64_t run);
// The run number of a fresh run: the first whose directory does not exist or is empty.
int64_t next_monitor_run(const MonitorConfig& config);

class CsvMonitor {
 public:
  // Writes DIR/metrics.csv (creating DIR). A fresh run (resume_step 0) creates the file with its
  // header; an existing file there is refused rather than overwritten. A run resumed after
  // `resume_step` steps appends to the file: rows of steps after resume_step (the steps trained
  // again) move to DIR/metrics.replaced-after-step<resume_step>.csv first, so metrics.csv has
  // one row per step and nothing is lost.
  // moe_experts > 0 (a model with experts): also DIR/moe.csv, the same way.
  CsvMonitor(const std::string& dir, int64_t resume_step = 0, int moe_experts = 0);
  ~CsvMonitor();
  CsvMonitor(const CsvMonitor&) = delete;
  CsvMonitor& operator=(const CsvMonitor&) = delete;

  void write(const StepMetrics& m);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  std::FILE* moe_file_ = nullptr;
};

}  // namespace zerod
