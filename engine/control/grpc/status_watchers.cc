#include "engine/control/grpc/status_watchers.h"

#include <fmt/format.h>

#include <algorithm>

#include "engine/control/grpc/control_service.h"

namespace zerod {

using Clock = std::chrono::steady_clock;

// One status, built once and written to every stream (kept alive while a write holds it).
struct StatusWatchers::Snapshot {
  uint64_t version = 0;
  bool last = false;  // the job ended (or none): the stream ends after this message
  v1::JobStatus msg;
};

// A refused call: finished at once, deleted when gRPC is done with it.
class RefusedStream : public grpc::ServerWriteReactor<v1::JobStatus> {
 public:
  explicit RefusedStream(const grpc::Status& st) { Finish(st); }
  void OnDone() override { delete this; }
};

// One WatchStatus stream. gRPC calls its reactions (OnWriteDone, OnCancel, OnDone) on its own
// threads, the watchers' thread calls offer(): all state is under mu_, and StartWrite / Finish
// are called only by whoever set busy_ (so one operation is in flight) and never under mu_ (gRPC
// may run a reaction inline, on the calling thread).
class StatusWatchers::Stream : public grpc::ServerWriteReactor<v1::JobStatus> {
 public:
  Stream(StatusWatchers& owner, std::chrono::milliseconds interval)
      : owner_(owner), interval_(interval) {}

  void start(std::shared_ptr<Stream> self, std::shared_ptr<const Snapshot> first) {
    self_ = std::move(self);
    offer(std::move(first), Clock::now(), interval_);
  }

  // A status: written now when nothing is in flight and it is new (or the stream's interval,
  // and at least `gap`, passed since the last one), else kept as the one to write next (the
  // newest wins).
  void offer(std::shared_ptr<const Snapshot> snap, Clock::time_point now,
             std::chrono::milliseconds gap) {
    std::shared_ptr<const Snapshot> write;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_) return;
      if (busy_) {
        if (snap->version != sent_version_) pending_ = std::move(snap);
        return;
      }
      if (snap->version == sent_version_ && now < sent_at_ + std::max(interval_, gap)) return;
      write = claim_locked(std::move(snap), now);
    }
    issue(write);
  }

  // Server shutdown: ends the stream (after the write in flight, if any).
  void end(const grpc::Status& st) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_) return;
      end_status_ = st;
      if (busy_) return;  // OnWriteDone finishes
      finished_ = busy_ = true;
    }
    Finish(st);
  }

  void OnWriteDone(bool ok) override {
    std::shared_ptr<const Snapshot> write;
    bool finish = false;
    grpc::Status status;
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_ = false;
      inflight_.reset();
      if (!ok || cancelled_ || !end_status_.ok()) {
        // The client went away (or cancelled), or the server is shutting down.
        finished_ = busy_ = finish = true;
        status = end_status_;
      } else if (pending_) {
        std::shared_ptr<const Snapshot> next = std::move(pending_);
        pending_.reset();
        if (next->version != sent_version_) write = claim_locked(std::move(next), Clock::now());
      }
    }
    if (write) issue(write);
    if (finish) Finish(status);
  }

  void OnCancel() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled_ = true;
      if (busy_ || finished_) return;  // the write in flight fails: OnWriteDone finishes
      finished_ = busy_ = true;
    }
    Finish(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    owner_.remove(this);
    std::shared_ptr<Stream> self = std::move(self_);  // may delete this when it goes
  }

 private:
  // Under mu_: takes the write slot for `snap`.
  std::shared_ptr<const Snapshot> claim_locked(std::shared_ptr<const Snapshot> snap,
                                               Clock::time_point now) {
    busy_ = true;
    sent_version_ = snap->version;
    sent_at_ = now;
    if (snap->last) finished_ = true;  // written with the final status
    inflight_ = snap;
    return snap;
  }
  void issue(const std::shared_ptr<const Snapshot>& s) {
    if (s->last) {
      StartWriteAndFinish(&s->msg, grpc::WriteOptions(), grpc::Status::OK);
    } else {
      StartWrite(&s->msg);
    }
  }
  StatusWatchers& owner_;
  const std::chrono::milliseconds interval_;
  std::mutex mu_;
  bool busy_ = false;      // a write or the finish is in flight (ours to issue)
  bool finished_ = false;  // Finish (or the final write) issued or decided
  bool cancelled_ = false;
  grpc::Status end_status_;  // non-OK: shutting down
  uint64_t sent_version_ = 0;
  Clock::time_point sent_at_{};
  std::shared_ptr<const Snapshot> inflight_, pending_;
  std::shared_ptr<Stream> self_;  // held until OnDone
};

StatusWatchers::StatusWatchers(Daemon& daemon, int max_streams)
    : daemon_(daemon), max_(max_streams) {
  thread_ = std::thread(&StatusWatchers::loop, this);
}

StatusWatchers::~StatusWatchers() {
  shutdown();
}

int StatusWatchers::open_streams() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(streams_.size());
}

std::shared_ptr<const StatusWatchers::Snapshot> StatusWatchers::snapshot(uint64_t version) const {
  auto s = std::make_shared<Snapshot>();
  s->version = version;
  const DaemonStatus st = daemon_.status();
  fill_status(st, &s->msg);
  s->last = st.state == JobState::kFinished || st.state == JobState::kFailed ||
            st.state == JobState::kInterrupted || st.state == JobState::kIdle;
  return s;
}

grpc::ServerWriteReactor<v1::JobStatus>* StatusWatchers::open(grpc::CallbackServerContext*,
                                                              const v1::WatchStatusRequest* req,
                                                              const grpc::Status& refusal) {
  if (!refusal.ok()) return new RefusedStream(refusal);
  const auto interval = std::clamp<std::chrono::milliseconds>(
      std::chrono::milliseconds(req->max_interval_ms() > 0 ? req->max_interval_ms() : 1000),
      kMinInterval, kMaxInterval);
  auto stream = std::make_shared<Stream>(*this, interval);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      return new RefusedStream({grpc::StatusCode::UNAVAILABLE, "the daemon is shutting down"});
    }
    if (static_cast<int>(streams_.size()) >= max_) {
      return new RefusedStream(
          {grpc::StatusCode::RESOURCE_EXHAUSTED,
           fmt::format("too many WatchStatus streams: {} are open, the cap is {} (zerod serve "
                       "--max-watchers N raises it); poll GetStatus (zeroctl status) instead",
                       streams_.size(), max_)});
    }
    streams_.push_back(stream);
  }
  Stream* raw = stream.get();
  raw->start(std::move(stream), snapshot(daemon_.version()));
  return raw;
}

void StatusWatchers::remove(const Stream* s) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find_if(streams_.begin(), streams_.end(),
                         [&](const std::shared_ptr<Stream>& p) { return p.get() == s; });
  if (it != streams_.end()) {
    std::swap(*it, streams_.back());
    streams_.pop_back();
  }
  cv_.notify_all();
}

std::chrono::milliseconds StatusWatchers::gap(size_t streams) {
  return std::max(kMinGap, std::chrono::milliseconds(static_cast<int64_t>(
                               1000 * streams / static_cast<size_t>(kMaxMessagesPerSecond))));
}

void StatusWatchers::loop() {
  uint64_t seen = 0;
  std::shared_ptr<const Snapshot> snap;
  Clock::time_point last_broadcast{};
  std::vector<std::shared_ptr<Stream>> streams;
  for (;;) {
    std::chrono::milliseconds min_gap;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (stopping_) return;
      // Nothing to do without streams: sleep until one opens (or a slice passes).
      if (streams_.empty()) {
        cv_.wait_for(lock, std::chrono::milliseconds(200));
        continue;
      }
      min_gap = gap(streams_.size());
    }
    // Changes closer than the gap are coalesced: the next broadcast carries the newest.
    const auto wait_until = last_broadcast + min_gap;
    if (Clock::now() < wait_until) std::this_thread::sleep_until(wait_until);
    const uint64_t v = daemon_.wait_change(seen, std::chrono::milliseconds(50));
    if (v != seen || !snap) {
      seen = v;
      snap = snapshot(v);
      last_broadcast = Clock::now();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      streams = streams_;
    }
    const auto now = Clock::now();
    for (const auto& s : streams) s->offer(snap, now, min_gap);
    streams.clear();
  }
}

void StatusWatchers::shutdown() {
  std::vector<std::shared_ptr<Stream>> streams;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    streams = streams_;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  for (const auto& s : streams)
    s->end({grpc::StatusCode::UNAVAILABLE, "the daemon is shutting down"});
}

}  // namespace zerod
