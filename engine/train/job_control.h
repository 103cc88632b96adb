// The link between a running job's ranks and whoever controls it (the daemon, engine/control/):
// commands in (save a checkpoint, stop), progress out (steps, losses, memory, saves), with no
// gRPC. Commands take effect at a step boundary on every rank at once: global rank 0 offers
// what is pending, and the ranks agree on it through one small all-reduce per step (the same
// one that carries SIGTERM/SIGUSR1 stop requests).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "engine/metrics/csv_monitor.h"

namespace zerod {

struct RankMemoryUse {
  int64_t current = 0, peak = 0;
};

// What the controller sees of the job.
struct JobProgress {
  int64_t step = 0, total_steps = 0;
  int world_size = 0;
  std::optional<StepMetrics> last;      // rank 0's last step
  double seconds_per_step = 0;          // recent average (for an ETA)
  std::map<int, RankMemoryUse> memory;  // this process's ranks
  std::string last_checkpoint;          // the last save asked for by the controller
  std::optional<double> val_loss;       // the last validation loss (eval_interval)
  int64_t global_batch = 0;             // samples a step (train_batch_size)
  int64_t samples_seen() const { return step * global_batch; }
};

class JobControl {
 public:
  // ---- controller side ----
  // Asks for a save at the next step boundary (empty tag: the default global_step<N>).
  // Returns a ticket for wait_save. Only one save may be pending.
  int64_t request_save(const std::string& tag);
  // Waits until the save of `ticket` committed (returns tag and step) or failed (throws the
  // error's message as InputError), or the job ended first. false: timeout.
  struct SaveResult {
    std::string tag;
    int64_t step = 0;
    std::string error;       // non-empty: failed
    bool job_ended = false;  // failed because the job ended before the save
  };
  std::optional<SaveResult> wait_save(int64_t ticket, std::chrono::milliseconds timeout);
  void request_stop(bool checkpoint);
  bool save_pending() const;
  bool stop_pending() const;
  JobProgress progress() const;
  // Calls `f` (under no lock) after every change of progress; one listener at a time.
  void set_listener(std::function<void()> f);
  // The job ended: pending saves fail with `why`.
  void job_ended(const std::string& why);

  // ---- rank side ----
  struct Command {
    bool save = false, stop = false, stop_checkpoint = false;
    std::string tag;
  };
  // Global rank 0: what is pending now (taken: a second call returns nothing new).
  Command take();
  void set_world(int world_size, int64_t total_steps, int64_t global_batch = 0);
  void on_step(int rank, const StepMetrics& m, RankMemoryUse mem);
  void on_saved(const std::string& tag, int64_t step, const std::string& error);

 private:
  void notify();
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> listener_;
  // commands
  bool save_ = false, stop_ = false, stop_checkpoint_ = false;
  std::string tag_;
  int64_t next_ticket_ = 1, pending_ticket_ = 0, taken_ticket_ = 0;
  std::map<int64_t, SaveResult> results_;
  // progress
  JobProgress progress_;
  double last_step_time_ = 0;
};

}  // namespace zerod
