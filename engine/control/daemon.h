// The daemon behind `zerod serve` (DESIGN.md section 6), without gRPC: one job at a time, its
// state machine, commands to the running job through JobControl, and the status that
// GetStatus / WatchStatus report. engine/control/grpc/ puts the Control service in front.
//
//   idle -> rendezvous -> running <-> checkpointing -> (stopping) -> finished | failed
//
// A finished or failed job may be followed by a new SubmitJob or by Resume (the same job from
// a checkpoint).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "engine/checkpoint/manifest.h"
#include "engine/config/job_config.h"
#include "engine/control/journal.h"
#include "engine/metrics/metrics_sink.h"
#include "engine/runtime/launch.h"
#include "engine/runtime/node_session.h"
#include "engine/train/job_control.h"

namespace zerod {

// kInterrupted: a job that was running when the daemon ended without ending it (killed, crashed),
// found in the daemon's journal at its restart; `zeroctl resume` continues it.
enum class JobState {
  kIdle,
  kRendezvous,
  kRunning,
  kCheckpointing,
  kStopping,
  kFinished,
  kFailed,
  kInterrupted
};
const char* job_state_name(JobState s);  // "idle", "rendezvous", ...

// A command that does not fit the daemon's state (FAILED_PRECONDITION; exit code 2).
class PreconditionError : public InputError {
 public:
  explicit PreconditionError(std::string message) : InputError(std::move(message)) {}
};

// No such checkpoint (NOT_FOUND; exit code 2). The message lists the tags there are.
class NotFoundError : public InputError {
 public:
  explicit NotFoundError(std::string message) : InputError(std::move(message)) {}
};

// A checkpoint of that tag exists (ALREADY_EXISTS; exit code 2).
class AlreadyExistsError : public InputError {
 public:
  explicit AlreadyExistsError(std::string message) : InputError(std::move(message)) {}
};

struct DaemonStatus {
  JobState state = JobState::kIdle;
  std::string job_id;
  std::string job_name;  // as submitted (the job file's path)
  std::string reason;    // failed: why
  bool stopped = false;
  double elapsed_seconds = 0;
  JobProgress progress;
};

struct CheckpointListing {
  std::string tag;
  bool latest = false;
  Manifest manifest;
};

// A job as the master daemon hands it to the node daemons (FollowJobs).
struct JobAssignment {
  uint64_t seq = 0;  // 0: none yet
  std::string job_id;
  std::string job_json;  // the resolved job
  std::string resume;
  std::string rendezvous;  // HOST:PORT of the job's Rendezvous (hosted by the master)
};

struct DaemonOptions {
  LaunchSpec spec;  // this node's part of every job (nproc_per_node, nnodes, ...)
  // Several nodes: the master (spec.node_rank 0) hosts each job's Rendezvous here; node
  // daemons say where the master's Control service is (for messages).
  std::string rendezvous;
  std::string master_control;
  MetricsSink* metrics = nullptr;  // every job's per-step numbers (not owned)
  bool log_steps = true;
  int threads_per_rank = 0;  // OpenMP threads of each rank; 0: cores / local ranks
  // `zerod train --listen`: the daemon serves one job the process started itself (start_job);
  // SubmitJob, Resume and FollowJobs are refused, and there are no node daemons.
  bool one_off = false;
  // The journal of the current job (not owned; null: none). At construction the daemon reads
  // it: a job that was running is reported interrupted and Resume continues it; job ids go on
  // from the count it keeps.
  StateDir* state = nullptr;
  // Starts the node session of a job (local for one node, the gRPC rendezvous for several).
  std::function<std::unique_ptr<NodeSession>(const LaunchSpec&, const JobConfig&)> start_session;
};

class Daemon {
 public:
  // InputError when the state directory's journal cannot be read.
  explicit Daemon(DaemonOptions options);
  ~Daemon();  // stops a running job (no checkpoint) and waits for it
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Parses, resolves and checks a job (ConfigError: INVALID_ARGUMENT) and starts it
  // (PreconditionError while another runs). Its relative paths resolve against base_dir
  // (absolute); without one they must all be absolute (ConfigError naming the keys). A resume
  // tag (or latest) the checkpoint dir does not hold: NotFoundError. Returns the job id.
  std::string submit(const std::string& job_text, const std::string& name,
                     const std::string& resume = "", const std::string& base_dir = "");
  // Runs the last job again from checkpoint `tag` ("" or "latest": the newest complete one).
  // PreconditionError while a job runs; NotFoundError when there is no such checkpoint.
  std::string resume(const std::string& tag);
  // One-off (`zerod train --listen`): starts the process's own job, parsed and resolved by the
  // caller. Returns the job id.
  std::string start_job(JobConfig cfg, const std::string& resume, const std::string& name);
  // The exception that failed the last job (rethrown, with its kind and exit code); nothing when
  // it did not fail.
  void rethrow_failure() const;
  // Saves a checkpoint of the running job at its next step boundary and waits until it is
  // committed (or fails: InputError; the job ended first: PreconditionError). A tag that exists
  // in the checkpoint dir: AlreadyExistsError unless overwrite (the default global_step<N> tag
  // is never refused: a resumed job saves its steps again).
  JobControl::SaveResult save_checkpoint(const std::string& tag, std::chrono::milliseconds timeout,
                                         bool overwrite = false);
  // Asks the running job to stop at its next step boundary, checkpointing first when asked;
  // returns its id at once (the job is down when its state is finished or failed).
  std::string stop(bool checkpoint);
  std::vector<CheckpointListing> list_checkpoints(std::string* dir) const;

  // Master of several nodes: node daemons following its jobs.
  // PreconditionError: not a master, rank out of range or already followed, or the node's
  // nnodes / nproc_per_node differ from the master's.
  void follow_begin(int node_rank, int nnodes, int nproc_per_node);
  void follow_end(int node_rank);
  // The newest assignment when its seq differs from `seen` (waits up to timeout), else nullopt.
  std::optional<JobAssignment> wait_assignment(uint64_t seen,
                                               std::chrono::milliseconds timeout) const;
  uint64_t assignment_seq() const;
  // Node daemon: runs the master's assignment (waits for a previous job to end first).
  void run_assignment(const JobAssignment& a);

  DaemonStatus status() const;
  // Incremented at every change of status; wait_change returns the new version (or `seen` on
  // timeout).
  uint64_t version() const;
  uint64_t wait_change(uint64_t seen, std::chrono::milliseconds timeout) const;
  // True while a job thread runs.
  bool busy() const;
  // Waits for the job thread to end (after a stop signal, say); false on timeout.
  bool wait_idle(std::chrono::milliseconds timeout) const;

 private:
  bool multi_node() const { return opt_.spec.nnodes > 1; }
  bool is_master() const { return opt_.spec.node_rank == 0; }
  // The master daemon of several nodes: node daemons follow its jobs (never a one-off daemon).
  bool master_of_nodes() const { return multi_node() && is_master() && !opt_.one_off; }
  // PreconditionError naming `what` in a one-off daemon.
  void refuse_one_off(const char* what) const;
  // Master, under mu_: refuses when a node daemon is not following.
  void check_followers_locked() const;
  // Master, under mu_: publishes the assignment of job `jobs_ + 1`.
  void assign_locked(const JobConfig& cfg, const std::string& resume);
  // text, name: the job file as submitted (journal; parsed again by a restarted daemon).
  void start(JobConfig cfg, const std::string& resume, LaunchSpec spec, const std::string& text,
             const std::string& name, const std::string& base_dir, const std::string& job_id = "");
  // At construction: the journal's job (interrupted when it was running).
  void recover();
  // Under mu_: the journal of the current job (InputError when it cannot be written).
  void write_journal_locked(int64_t jobs_started) const;
  void run(JobConfig cfg, std::string resume, LaunchSpec spec, std::shared_ptr<JobControl> control);
  void set_state(JobState s, const std::string& reason = "", bool stopped = false);
  void changed();

  DaemonOptions opt_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  uint64_t version_ = 1;
  JobState state_ = JobState::kIdle;
  std::string job_id_, reason_;
  bool stopped_ = false;
  bool running_ = false;  // the job thread has not ended
  int jobs_ = 0;
  std::chrono::steady_clock::time_point started_;
  double elapsed_ = 0;
  std::optional<JobConfig> last_job_;
  std::string last_text_, last_name_, last_resume_, last_cwd_, last_base_dir_;  // the journal's
  std::string recover_error_;  // the journal's job no longer parses: why
  JobProgress recovered_;      // the progress of a job found in the journal
  std::shared_ptr<JobControl> control_;
  std::exception_ptr failure_;  // what failed the last job
  std::thread thread_;
  std::set<int> followers_;
  JobAssignment assignment_;
};

}  // namespace zerod
