// csv_monitor: OUTPUT_PATH/JOB_NAME/metrics.csv, one row per optimizer step.
// Columns: step,loss,lr,grad_norm,loss_scale,tokens_per_s,mfu,skipped,val_loss (val_loss empty
// on steps without a validation pass). Losses carry 9 significant digits.
#pragma once

#include <cstdio>
#include <optional>
#include <string>

#include "engine/config/job_config.h"

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
};

// Where a monitor writes: OUTPUT_PATH/JOB_NAME ("." when output_path is empty), as DeepSpeed's
// monitors lay it out.
std::string monitor_dir(const MonitorConfig& config);

class CsvMonitor {
 public:
  // Creates the directory and the file and writes the header. Resuming after `resume_step`
  // steps keeps the rows of steps 1..resume_step of an existing file and appends after them.
  explicit CsvMonitor(const MonitorConfig& config, int64_t resume_step = 0);
  ~CsvMonitor();
  CsvMonitor(const CsvMonitor&) = delete;
  CsvMonitor& operator=(const CsvMonitor&) = delete;

  void write(const StepMetrics& m);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace zerod
