#include "comm/nccl/nccl_watchdog.h"

#include <fmt/format.h>
#include <pthread.h>

#include <algorithm>
#include <vector>

#include "comm/nccl/cuda_handles.h"
#include "comm/nccl/nccl_error.h"
#include "core/log.h"

namespace zerod::nccl_backend {

namespace {

using Micros = std::chrono::microseconds;

double ms_between(std::chrono::steady_clock::time_point a,
                  std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// An event's state: true when complete, false when not yet; a CUDA error is returned in `error`.
// The runtime may record cudaErrorNotReady as the thread's last error: cleared here, so that the
// caller's next error check does not see it.
bool event_done(cudaEvent_t event, cudaError_t* error) {
  const cudaError_t e = cudaEventQuery(event);
  if (e == cudaSuccess) return true;
  cudaGetLastError();
  if (e != cudaErrorNotReady) *error = e;
  return false;
}

}  // namespace

std::shared_ptr<Watchdog> Watchdog::start(ncclComm_t comm, const Config& config) {
  std::shared_ptr<Watchdog> w(new Watchdog(comm, config));
  w->thread_ = std::thread([raw = w.get()] { raw->thread_main(); });
  return w;
}

Watchdog::Watchdog(ncclComm_t comm, const Config& config)
    : rank_(config.rank),
      size_(config.size),
      device_(config.device),
      timeout_(config.timeout),
      poll_(std::clamp(config.timeout / 20, std::chrono::milliseconds(1),
                       std::chrono::milliseconds(10))),
      monitor_(config.monitor),
      names_(config.names),
      log_(config.size),
      comm_(comm) {}

Watchdog::~Watchdog() {
  shutdown();
}

int64_t Watchdog::sequence() const {
  std::lock_guard<std::mutex> lock(mu_);
  return seq_;
}

// ---------------------------------------------------------------------------------------------
// Issue side
// ---------------------------------------------------------------------------------------------

int64_t Watchdog::number(const char* op, const std::string& detail, int64_t bytes, bool message) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!broken_.empty()) {
    ZD_THROW_KIND(ErrorKind::kPeerLost,
                  "{} ({}) not started on {}: the communicator failed earlier: {}", op, detail,
                  names_.rank(rank_), broken_);
  }
  ZD_CHECK(!shut_down_, "{} issued while the communicator is being destroyed", op);
  const int64_t seq = message ? -(++message_ids_) : ++seq_;
  log_.issued(seq, op, detail, bytes);
  return seq;
}

void Watchdog::launch(const std::function<ncclResult_t(ncclComm_t)>& call,
                      Clock::time_point deadline) {
  std::unique_lock<std::mutex> nccl(nccl_mu_);
  auto aborted = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    return Error(ErrorKind::kPeerLost,
                 fmt::format("the NCCL communicator was aborted: {}",
                             broken_.empty() ? std::string("it was destroyed") : broken_),
                 __FILE__, __LINE__);
  };
  if (comm_ == nullptr) throw aborted();
  ncclResult_t state = call(comm_);
  // A non-blocking communicator may answer ncclInProgress (e.g. while it connects to the peers
  // of this collective for the first time): the operation is on the stream once the
  // communicator's state leaves ncclInProgress. The lock is let go between polls, so that the
  // watchdog can abort meanwhile.
  auto pause = Micros(20);
  while (state == ncclInProgress) {
    if (Clock::now() >= deadline) {
      ZD_THROW_KIND(ErrorKind::kPeerLost,
                    "NCCL did not enqueue it within the timeout (still ncclInProgress: are the "
                    "other ranks issuing it?)");
    }
    nccl.unlock();
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, Micros(1000));
    nccl.lock();
    if (comm_ == nullptr) throw aborted();
    ncclResult_t async = ncclInProgress;
    const ncclResult_t query = ncclCommGetAsyncError(comm_, &async);
    state = query != ncclSuccess ? query : async;
  }
  if (state != ncclSuccess) {
    throw Error(nccl_error_kind(state),
                fmt::format("launching it failed: {}", nccl_error_text(state, comm_)), __FILE__,
                __LINE__);
  }
}

void Watchdog::track(const WorkPtr& work) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_.empty()) {
      inflight_.push_back(work);
    } else {  // the communicator broke while this one was being issued
      finish_failed(*work, later_error(*work));
    }
  }
  wake_.notify_all();
  done_.notify_all();
}

void Watchdog::fail_issue(const WorkPtr& work, ErrorKind kind, const std::string& reason) {
  break_with(work, failure_error(Failure{work, kind, reason, false, std::nullopt}));
}

// ---------------------------------------------------------------------------------------------
// Completion side
// ---------------------------------------------------------------------------------------------

void Watchdog::mark_started(NcclWork& w, Clock::time_point now) {
  w.phase_ = NcclWork::Phase::kStarted;
  w.started_at_ = now;
  log_.started(w.seq_);
  if (monitor_ && w.seq_ > 0) monitor_->on_start(rank_, w.seq_);
}

void Watchdog::finish_ok(NcclWork& w) {
  w.phase_ = NcclWork::Phase::kFinished;
  if (monitor_ && w.seq_ > 0) monitor_->on_complete(rank_, w.seq_);
  log_.ended(w.seq_, true);
}

void Watchdog::finish_failed(NcclWork& w, Error error) {
  w.error_ = std::move(error);
  w.phase_ = NcclWork::Phase::kFinished;
  log_.ended(w.seq_, false);
}

Error Watchdog::later_error(const NcclWork& w) const {
  return Error(ErrorKind::kPeerLost,
               fmt::format("{} did not complete on {}: an earlier collective failed: {}", w.what(),
                           names_.rank(rank_), broken_),
               __FILE__, __LINE__);
}

Error Watchdog::failure_error(const Failure& f) const {
  std::string message =
      f.started ? fmt::format("{} failed on {} after {:.0f} ms (timeout {} ms): {}", f.work->what(),
                              names_.rank_of(rank_, size_), ms_between(*f.started, Clock::now()),
                              timeout_.count(), f.reason)
                : fmt::format("{} failed on {} (timeout {} ms): {}", f.work->what(),
                              names_.rank_of(rank_, size_), timeout_.count(), f.reason);
  // (A message's peers are named in its description; the monitor's progress counts collectives.)
  if (f.kind == ErrorKind::kPeerLost && monitor_ && f.work->sequence() > 0) {
    std::string missing;
    try {
      missing = describe_missing_ranks(monitor_->snapshot(), f.work->sequence(), rank_,
                                       names_.global_ranks);
      if (missing.empty()) {
        missing = f.timed_out ? "every other rank had started it (do the ranks issue the same "
                                "collectives with the same sizes?)"
                              : "every other rank had started it";
      }
    } catch (const std::exception& e) {
      missing = fmt::format("(the peer monitor failed: {})", e.what());
    }
    message += "; " + missing;
  }
  return Error(f.kind, message, __FILE__, __LINE__);
}

void Watchdog::progress() {
  std::optional<Failure> failure;
  std::vector<WorkPtr> released;  // destroyed after the lock is let go
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (inflight_.empty()) return;
    const auto now = Clock::now();
    while (!inflight_.empty()) {
      const WorkPtr& w = inflight_.front();
      cudaError_t error = cudaSuccess;
      if (event_done(w->end_event(), &error)) {
        if (w->phase_ == NcclWork::Phase::kQueued) mark_started(*w, now);
        finish_ok(*w);
        released.push_back(w);
        inflight_.pop_front();
        continue;
      }
      if (error == cudaSuccess && w->phase_ == NcclWork::Phase::kQueued &&
          event_done(w->start_event(), &error)) {
        mark_started(*w, now);
      }
      if (error != cudaSuccess) {
        failure = Failure{
            w, ErrorKind::kInternal,
            fmt::format("CUDA error {} on GPU {} while it ran", cuda_error_text(error), device_),
            false, std::nullopt};
      } else if (w->phase_ == NcclWork::Phase::kStarted && now - w->started_at_ >= timeout_) {
        failure = Failure{w, ErrorKind::kPeerLost,
                          fmt::format("timed out: it started on GPU {} but did not finish "
                                      "there (the NCCL communicator is aborted)",
                                      device_),
                          true, std::nullopt};
      }
      break;
    }
    if (!failure && !inflight_.empty() && nccl_mu_.try_lock()) {
      std::lock_guard<std::mutex> nccl(nccl_mu_, std::adopt_lock);
      if (comm_ != nullptr) {
        ncclResult_t async = ncclSuccess;
        const ncclResult_t query = ncclCommGetAsyncError(comm_, &async);
        const ncclResult_t state = query != ncclSuccess ? query : async;
        if (state != ncclSuccess && state != ncclInProgress) {
          failure = Failure{inflight_.front(), nccl_error_kind(state),
                            "NCCL reported " + nccl_error_text(state, comm_), false, std::nullopt};
        }
      }
    }
    if (failure && failure->work->phase_ == NcclWork::Phase::kStarted) {
      failure->started = failure->work->started_at_;
    }
  }
  if (!released.empty()) done_.notify_all();
  released.clear();
  if (failure) break_with(failure->work, failure_error(*failure));
}

void Watchdog::break_with(const WorkPtr& work, const Error& error) {
  bool first = false;
  std::deque<WorkPtr> failed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (work->phase_ == NcclWork::Phase::kFinished) return;  // another thread got there first
    first = broken_.empty();
    if (first) broken_ = error.what();
    finish_failed(*work, first ? error : later_error(*work));
    for (const WorkPtr& w : inflight_) {
      if (w != work) finish_failed(*w, later_error(*w));
    }
    failed.swap(inflight_);
    abort_pending_ = true;
  }
  wake_.notify_all();
  done_.notify_all();
  if (first) {
    // The flight recorder: what this rank did last, for reading the ranks' logs side by side.
    spdlog::warn("{}\n  last collectives of {}:{}", error.what(), names_.rank(rank_),
                 log_.describe_recent(8));
  }
}

void Watchdog::wait(NcclWork& work) {
  int spins = 0;
  auto pause = Micros(20);
  std::optional<Error> error;
  for (;;) {
    progress();
    std::unique_lock<std::mutex> lock(mu_);
    auto is_finished = [&] { return work.phase_ == NcclWork::Phase::kFinished; };
    if (!is_finished()) {
      if (spins < 200) {  // short collectives: stay close
        ++spins;
        lock.unlock();
        std::this_thread::yield();
        continue;
      }
      done_.wait_for(lock, pause, is_finished);
      pause = std::min(pause * 2, Micros(1000));
    }
    if (is_finished()) {
      error = work.error_;
      break;
    }
  }
  if (error) throw *error;
}

bool Watchdog::finished(const NcclWork& work) {
  progress();
  std::lock_guard<std::mutex> lock(mu_);
  return work.phase_ == NcclWork::Phase::kFinished;
}

// ---------------------------------------------------------------------------------------------
// The thread, abort and teardown
// ---------------------------------------------------------------------------------------------

void Watchdog::thread_main() {
  log::set_thread_rank(names_.global(rank_));
  pthread_setname_np(pthread_self(),
                     fmt::format("zd-nccl-{}", names_.global(rank_)).substr(0, 15).c_str());
  if (cudaSetDevice(device_) != cudaSuccess) cudaGetLastError();
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (abort_pending_) {
      abort_pending_ = false;
      lock.unlock();
      abort_comm();
      lock.lock();
      continue;
    }
    if (stop_) return;
    if (inflight_.empty()) {
      wake_.wait(lock);
      continue;
    }
    wake_.wait_for(lock, poll_);
    if (abort_pending_ || stop_ || inflight_.empty()) continue;
    lock.unlock();
    progress();
    lock.lock();
  }
}

void Watchdog::abort_comm() {
  std::lock_guard<std::mutex> nccl(nccl_mu_);
  if (comm_ == nullptr) return;
  const ncclResult_t r = ncclCommAbort(comm_);
  comm_ = nullptr;
  if (r != ncclSuccess) {
    spdlog::warn("aborting the NCCL communicator of {}: {}", names_.rank(rank_),
                 nccl_error_text(r));
  }
}

void Watchdog::finalize_or_abort() {
  std::lock_guard<std::mutex> nccl(nccl_mu_);
  if (comm_ == nullptr) return;
  const int previous = [] {
    int d = -1;
    if (cudaGetDevice(&d) != cudaSuccess) cudaGetLastError();
    return d;
  }();
  if (previous != device_ && cudaSetDevice(device_) != cudaSuccess) cudaGetLastError();
  const auto deadline = Clock::now() + std::min(timeout_, std::chrono::milliseconds(10000));
  ncclResult_t state = ncclCommFinalize(comm_);
  auto pause = Micros(50);
  while (state == ncclInProgress && Clock::now() < deadline) {
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, Micros(5000));
    ncclResult_t async = ncclInProgress;
    const ncclResult_t query = ncclCommGetAsyncError(comm_, &async);
    state = query != ncclSuccess ? query : async;
  }
  if (state == ncclSuccess) {
    const ncclResult_t r = ncclCommDestroy(comm_);
    if (r != ncclSuccess) {
      spdlog::warn("destroying the NCCL communicator of {}: {}", names_.rank(rank_),
                   nccl_error_text(r));
    }
  } else {
    spdlog::warn("finalizing the NCCL communicator of {} failed ({}); aborting it",
                 names_.rank(rank_),
                 state == ncclInProgress ? std::string("not finished in time")
                                         : nccl_error_text(state, comm_));
    ncclCommAbort(comm_);
  }
  comm_ = nullptr;
  if (previous >= 0 && previous != device_ && cudaSetDevice(previous) != cudaSuccess) {
    cudaGetLastError();
  }
}

void Watchdog::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  progress();  // what has finished finishes well
  std::deque<WorkPtr> failed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!inflight_.empty()) {
      if (broken_.empty())
        broken_ = fmt::format("the communicator of {} was destroyed", names_.rank(rank_));
      for (const WorkPtr& w : inflight_) {
        finish_failed(*w, Error(ErrorKind::kPeerLost,
                                fmt::format("{} did not complete on {}: the communicator was "
                                            "destroyed",
                                            w->what(), names_.rank(rank_)),
                                __FILE__, __LINE__));
      }
      failed.swap(inflight_);
    }
    if (!broken_.empty()) abort_pending_ = true;
    stop_ = true;
  }
  wake_.notify_all();
  done_.notify_all();
  if (thread_.joinable()) thread_.join();  // it runs a pending abort before it stops
  finalize_or_abort();                     // a healthy communicator
}

}  // namespace zerod::nccl_backend
