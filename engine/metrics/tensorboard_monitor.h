// The `tensorboard` monitor: TensorBoard event files written natively, no TensorFlow or
// protobuf library needed. A file is a sequence of TFRecords (little-endian uint64 length,
// masked CRC32C of the length, the bytes, masked CRC32C of the bytes), each holding one
// serialized tensorflow.Event: the first with file_version "brain.Event:2", then one per step
// with a Summary of simple_value scalars. `tensorboard --logdir OUTPUT_PATH` shows them.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "engine/config/job_config.h"
#include "engine/metrics/csv_monitor.h"

namespace zerod {

// TFRecord's checksum: CRC32C rotated right by 15 bits plus 0xa282ead8.
uint32_t masked_crc32c(const void* data, size_t n);

// One events file, appended record by record (flushed after each step).
class EventFileWriter {
 public:
  // Creates dir (and parents) and dir/events.out.tfevents.<unix time>.<host>.<pid> (".<n>"
  // added when that name exists: an existing file is never overwritten).
  explicit EventFileWriter(const std::string& dir);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  // One Event at `step` holding every (tag, value) scalar.
  void add_scalars(int64_t step, const std::vector<std::pair<std::string, float>>& scalars,
                   double wall_time);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& bytes);
  std::string path_;
  std::FILE* file_ = nullptr;
};

class TensorBoardMonitor {
 public:
  // Events go to `dir`: monitor_run_dir of the tensorboard section, OUTPUT_PATH/JOB_NAME/ (as
  // DeepSpeed's monitor lays them out) or a numbered sibling (csv_monitor.h).
  explicit TensorBoardMonitor(const std::string& dir);
  // train/loss, train/lr, train/grad_norm, train/loss_scale, perf/tokens_per_s, perf/mfu,
  // memory/rank0_mib (the rank's tracked bytes), and val/loss when the step validated; with
  // experts moe_scalars' moe/... (moe_metrics.h).
  void write(const StepMetrics& m, int64_t memory_bytes);
  const std::string& path() const { return writer_.path(); }

 private:
  EventFileWriter writer_;
};

}  // namespace zerod
