// The collectives in flight of one NCCL communicator (comm/nccl/) and the thread that watches
// them. The Watchdog owns the NCCL communicator handle: every NCCL call on it goes through
// launch() (or the watchdog's own abort, finalize and error queries), under one lock, so that an
// abort never races a launch.
//
// Works finish in issue order (one communication stream). progress(), called by the watchdog
// thread every poll interval (timeout / 20, between 1 and 10 ms) and by every thread that waits
// on or asks about a work, looks at the oldest unfinished work:
//   - its end event completed: it finished; the PeerMonitor and the collective log hear of it;
//   - its start event completed: it started on the GPU (the monitor and the log hear of it) and
//     its timeout counts from that moment;
//   - started more than `timeout` ago, NCCL's asynchronous error (ncclCommGetAsyncError) set, or
//     a CUDA error from the event queries: the communicator breaks.
// Breaking fails that work with an error naming it (its sequence number, size, the time it ran,
// the timeout, and for lost peers the ranks the PeerMonitor says had not arrived), fails every
// later work in flight, makes later issues throw at once, logs the last collectives (the flight
// recorder), and hands ncclCommAbort to the watchdog thread: the caller gets its error at once,
// even where an abort waits for the other ranks of the node to abort too. The kernels of the
// aborted communicator exit soon after; the collectives' buffers hold undefined values.
#pragma once

#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "comm/collective_log.h"
#include "comm/nccl/nccl_work.h"
#include "comm/peer_monitor.h"
#include "comm/rank_names.h"
#include "core/error.h"

namespace zerod::nccl_backend {

class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;
  struct Config {
    int rank = 0;
    int size = 1;
    int device = 0;
    std::chrono::milliseconds timeout{0};
    std::shared_ptr<PeerMonitor> monitor;  // may be null
    RankNames names;                       // empty for a world's communicator
  };

  // Takes `comm` (ready, created non-blocking) and starts the watchdog thread.
  static std::shared_ptr<Watchdog> start(ncclComm_t comm, const Config& config);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // ---- Issue side: one issuing thread at a time (the communicator's issue lock). ------------
  // Numbers the next collective and logs it as issued ("all_reduce", "1001 x f32, sum", bytes:
  // see collective_log.h). Throws Error(kPeerLost) "<op> (<detail>) not started on rank r: the
  // communicator failed earlier: <first failure>" when broken.
  // `message`: a point-to-point operation (communicator.h), which takes no sequence number: it
  // gets the next negative id instead (its log id and Work::sequence()), and the PeerMonitor
  // hears nothing of it (its ranks' progress counts collectives only).
  int64_t number(const char* op, const std::string& detail, int64_t bytes, bool message = false);
  // Runs `call` (one NCCL collective on the communicator) and, while NCCL answers
  // ncclInProgress, polls until the operation is on the stream. Throws Error: NCCL's failure
  // (nccl_error_kind), kPeerLost when it is still not enqueued at `deadline` or the communicator
  // was aborted meanwhile.
  void launch(const std::function<ncclResult_t(ncclComm_t)>& call, Clock::time_point deadline);
  // Watches `work`, whose events are recorded around its kernel, until it finishes.
  void track(const std::shared_ptr<NcclWork>& work);
  // Issuing `work` failed (`reason`, of `kind`): the work fails and the communicator breaks.
  void fail_issue(const std::shared_ptr<NcclWork>& work, ErrorKind kind, const std::string& reason);

  // ---- Completion side: any thread. ----------------------------------------------------------
  // See the top of this file. Never blocks (except on the monitor's snapshot when it breaks).
  void progress();
  // Returns when `work` finished (polling progress() with a short back-off); throws its error.
  void wait(NcclWork& work);
  bool finished(const NcclWork& work);

  int64_t sequence() const;
  const CollectiveLog& log() const { return log_; }

  // For the communicator's destructor; idempotent. Unfinished works fail ("the communicator was
  // destroyed") and NCCL is aborted; a healthy idle communicator is finalized (waited for at
  // most min(timeout, 10 s), aborted after) and destroyed. Stops the thread. Later issues throw.
  void shutdown();

 private:
  using WorkPtr = std::shared_ptr<NcclWork>;
  struct Failure {
    WorkPtr work;
    ErrorKind kind = ErrorKind::kInternal;
    std::string reason;
    bool timed_out = false;
    std::optional<Clock::time_point> started;
  };

  Watchdog(ncclComm_t comm, const Config& config);
  void thread_main();
  void abort_comm();         // takes nccl_mu_
  void finalize_or_abort();  // takes nccl_mu_
  // Under mu_: the work's transitions (with the monitor and the log).
  void mark_started(NcclWork& w, Clock::time_point now);
  void finish_ok(NcclWork& w);
  void finish_failed(NcclWork& w, Error error);
  Error failure_error(const Failure& f) const;
  Error later_error(const NcclWork& w) const;  // under mu_: for the works after the failed one
  // Breaks the communicator: `work` fails with `error`, every other work in flight with
  // later_error; the abort is handed to the thread.
  void break_with(const WorkPtr& work, const Error& error);

  const int rank_;
  const int size_;
  const int device_;
  const std::chrono::milliseconds timeout_;
  const std::chrono::milliseconds poll_;
  const std::shared_ptr<PeerMonitor> monitor_;
  const RankNames names_;
  CollectiveLog log_;

  std::mutex nccl_mu_;  // guards comm_ and every NCCL call on it
  ncclComm_t comm_;     // null once aborted or destroyed

  mutable std::mutex mu_;         // guards what follows and the works' phases
  std::condition_variable wake_;  // the thread: new work, abort, stop
  std::condition_variable done_;  // waiters: a work finished
  std::deque<WorkPtr> inflight_;  // issue order
  int64_t seq_ = 0;
  int64_t message_ids_ = 0;
  std::string broken_;  // the first failure; non-empty: the communicator is broken
  bool abort_pending_ = false;
  bool shut_down_ = false;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace zerod::nccl_backend
