#include "comm/gloo/executor.h"

#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>
#include <pthread.h>

#include <optional>

#include "comm/gloo/p2p.h"
#include "core/log.h"

namespace zerod::gloo_backend {

// ---------------------------------------------------------------------------------------------
// GlooWork
// ---------------------------------------------------------------------------------------------

class GlooWork : public Work {
 public:
  GlooWork(int64_t seq, std::weak_ptr<Executor> owner) : seq_(seq), owner_(std::move(owner)) {}

  void wait() override {
    if (auto owner = owner_.lock()) owner->run_if_next(this);
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    if (error_) throw *error_;
  }
  bool done() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  int64_t sequence() const override { return seq_; }

  void finish(std::optional<Error> error) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
      error_ = std::move(error);
    }
    cv_.notify_all();
  }

 private:
  const int64_t seq_;
  const std::weak_ptr<Executor> owner_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::optional<Error> error_;
};

// ---------------------------------------------------------------------------------------------
// Executor
// ---------------------------------------------------------------------------------------------

std::shared_ptr<Executor> Executor::start(std::shared_ptr<gloo::Context> context,
                                          std::chrono::milliseconds timeout,
                                          std::shared_ptr<PeerMonitor> monitor, RankNames names) {
  std::shared_ptr<Executor> e(
      new Executor(std::move(context), timeout, std::move(monitor), std::move(names)));
  e->thread_ = std::thread([raw = e.get()] { raw->thread_main(); });
  if (e->size_ > 1) e->watcher_ = std::thread([raw = e.get()] { raw->watch_main(); });
  if (e->size_ > 1 && e->monitor_)
    e->sentinel_ = std::thread([raw = e.get()] { raw->sentinel_main(); });
  return e;
}

Executor::Executor(std::shared_ptr<gloo::Context> context, std::chrono::milliseconds timeout,
                   std::shared_ptr<PeerMonitor> monitor, RankNames names)
    : context_(std::move(context)),
      rank_(context_->rank),
      size_(context_->size),
      timeout_(timeout),
      monitor_(std::move(monitor)),
      names_(std::move(names)),
      sent_(static_cast<size_t>(size_), 0),
      received_(static_cast<size_t>(size_), 0),
      log_(size_) {}

Executor::~Executor() {
  shutdown();
}

int64_t Executor::sequence() const {
  std::lock_guard<std::mutex> lock(mu_);
  return seq_;
}

WorkPtr Executor::submit(const char* op, const std::string& detail, int64_t bytes,
                         std::function<void(Link&)> run, const std::string& local) {
  const std::string full = local.empty() ? detail : detail + "; " + local;
  std::lock_guard<std::mutex> lock(mu_);
  if (!broken_.empty()) {
    ZD_THROW_KIND(ErrorKind::kPeerLost,
                  "{} ({}) not started on {}: the communicator failed earlier: {}", op, full,
                  names_.rank(rank_), broken_);
  }
  ZD_CHECK(!stopping_, "{} issued while the communicator is being destroyed", op);
  const int64_t seq = ++seq_;
  log_.issued(seq, op, full, bytes);
  auto work = std::make_shared<GlooWork>(seq, weak_from_this());
  const auto signature = static_cast<uint16_t>(std::hash<std::string>{}(op + ("|" + detail)));
  queue_.push_back(
      Task{work, seq, signature, fmt::format("{} #{} ({})", op, seq, full), std::move(run)});
  cv_.notify_all();
  return work;
}

void Executor::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    if (probe_ != nullptr) probe_->abortWaitRecv();
    const std::string destroyed =
        fmt::format("the communicator of rank {} was destroyed", names_.global(rank_));
    if (current_ != nullptr) current_->abort(destroyed);
    abort_p2p(destroyed, [](const P2PMessage&) { return true; });
  }
  cv_.notify_all();
  reap_cv_.notify_all();
  if (thread_.joinable()) thread_.join();  // it fails the queued tasks
  std::vector<std::thread> reapers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [key, r] : reapers_) reapers.push_back(std::move(r.thread));
  }
  for (auto& t : reapers) t.join();  // the aborted messages fail at once
  if (watcher_.joinable()) watcher_.join();
  if (sentinel_.joinable()) sentinel_.join();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !running_; });  // a task running inline in a waiting caller
}

void Executor::watch_main() {
  constexpr uint64_t kProbeSlot = 0x5Bull << 56;  // (our collectives use 0x5A..., Gloo's 0x01-0x08)
  constexpr auto kStuckAfter = std::chrono::milliseconds(1000);
  pthread_setname_np(pthread_self(),
                     fmt::format("zd-watch-{}", names_.global(rank_)).substr(0, 15).c_str());
  char byte = 0;
  std::unique_ptr<gloo::transport::UnboundBuffer> probe;
  std::string why;
  try {
    probe = context_->createUnboundBuffer(&byte, 1);
    for (int p = 0; p < size_; ++p) {
      if (p != rank_) probe->recv(p, kProbeSlot, 0, 1);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      probe_ = probe.get();
    }
    // Nobody sends on the probe slot: this returns false when shutdown() aborts the wait, and
    // throws when a pair fails.
    while (probe->waitRecv(nullptr, std::chrono::hours(24 * 365 * 10))) {
    }
  } catch (const std::exception& e) {
    why = tidy_gloo_message(e.what());
  }
  std::unique_lock<std::mutex> lock(mu_);
  probe_ = nullptr;
  if (why.empty()) return;
  const Link* aborted = nullptr;
  // Gloo closes a pair when an operation on it outlives the timeout; that closure can reach this
  // watcher before the operation's own timeout error reaches its caller: it is a timeout.
  const bool timed_out = why.find("Application timeout") != std::string::npos;
  const std::string reason =
      timed_out ? fmt::format(
                      "timed out: a peer sent no matching message within the timeout (Gloo "
                      "closed a connection of rank {}: {})",
                      names_.global(rank_), why)
                : fmt::format("a connection of rank {} failed: {}", names_.global(rank_), why);
  while (!stopping_) {
    const auto now = Clock::now();
    if (current_ != nullptr && current_ != aborted && now - current_since_ >= kStuckAfter) {
      current_->abort(reason);
      aborted = current_;
    }
    abort_p2p(reason, [&](const P2PMessage& m) { return now - m.issued() >= kStuckAfter; });
    cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return stopping_; });
  }
}

void Executor::sentinel_main() {
  // A collective younger than kSentinelAfter is left alone (most finish by then); after that the
  // monitor is asked every kSentinelPeriod (memory reads for the local and world monitors).
  constexpr auto kSentinelAfter = std::chrono::milliseconds(200);
  constexpr auto kSentinelPeriod = std::chrono::milliseconds(200);
  pthread_setname_np(pthread_self(),
                     fmt::format("zd-sent-{}", names_.global(rank_)).substr(0, 15).c_str());
  std::unique_lock<std::mutex> lock(mu_);
  const Link* aborted = nullptr;
  while (!stopping_) {
    cv_.wait_for(lock, kSentinelPeriod, [&] { return stopping_; });
    if (stopping_) break;
    const auto now = Clock::now();
    const bool collective =
        current_ != nullptr && current_ != aborted && now - current_since_ >= kSentinelAfter;
    auto old = [&](const P2PMessage& m) { return now - m.issued() >= kSentinelAfter; };
    bool messages = false;
    for (const auto& w : p2p_) {
      const auto m = w.lock();
      messages = messages || (m != nullptr && !m->done() && old(*m));
    }
    if (!collective && !messages) continue;
    const Link* link = current_;
    lock.unlock();  // (never call the monitor under our lock)
    const std::string dead = dead_peers();
    lock.lock();
    if (dead.empty() || stopping_) continue;
    if (collective && current_ == link) {
      current_->abort(dead);
      aborted = link;
    }
    if (messages) abort_p2p(dead, old);
  }
}

std::string Executor::dead_peers() {
  std::string dead;
  try {
    const std::vector<RankProgress> ranks = monitor_->snapshot();
    for (int r = 0; r < static_cast<int>(ranks.size()) && r < size_; ++r) {
      if (r == rank_ || ranks[static_cast<size_t>(r)].alive) continue;
      const std::string& why = ranks[static_cast<size_t>(r)].reason;
      dead += fmt::format("{}{} is dead{}", dead.empty() ? "" : "; ", names_.rank(r),
                          why.empty() ? "" : " (" + why + ")");
    }
  } catch (const std::exception&) {
    // The monitor could not answer now: the timeout and the connection watcher still hold.
  }
  return dead;
}

template <class Stuck>
void Executor::abort_p2p(const std::string& reason, Stuck stuck) {
  std::vector<std::weak_ptr<P2PMessage>> kept;
  for (const auto& w : p2p_) {
    const auto m = w.lock();
    if (m == nullptr || m->done()) continue;
    if (stuck(*m)) m->abort(reason);
    kept.push_back(w);
  }
  p2p_ = std::move(kept);
}

std::string Executor::peer(int r) const {
  return names_.is_world() ? fmt::format("rank {}", r)
                           : fmt::format("rank {} (group rank {})", names_.global(r), r);
}

WorkPtr Executor::post_p2p(const P2POp& op, size_t bytes, const std::string& detail) {
  const bool send = op.kind == P2POp::Kind::kSend;
  const char* kind = p2p_kind_name(op.kind);
  const std::string where = fmt::format("{} {}", send ? "to" : "from", peer(op.peer));
  std::shared_ptr<P2PMessage> message;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.empty()) {
      ZD_THROW_KIND(ErrorKind::kPeerLost,
                    "{} {} (tag {}, {}, {} bytes) not started on {}: the communicator failed "
                    "earlier: {}",
                    kind, where, op.tag, detail, bytes, names_.rank(rank_), broken_);
    }
    ZD_CHECK(!stopping_, "{} issued while the communicator is being destroyed", kind);
    uint32_t& next = (send ? sent_ : received_)[static_cast<size_t>(op.peer)];
    P2PMessage::Spec spec;
    spec.kind = op.kind;
    spec.peer = op.peer;
    spec.tag = op.tag;
    spec.bytes = bytes;
    spec.index = next++;
    spec.log_id = -(++p2p_ids_);
    spec.what = fmt::format("{} #{} {} (tag {}, {}, {} bytes)", kind, spec.index + 1, where, op.tag,
                            detail, bytes);
    log_.issued(spec.log_id, kind, fmt::format("{}, tag {}; {}", detail, op.tag, where),
                static_cast<int64_t>(bytes));
    log_.started(spec.log_id);
    message = std::make_shared<P2PMessage>(std::move(spec), op.data, Clock::now() + timeout_,
                                           weak_from_this());
    abort_p2p({}, [](const P2PMessage&) { return false; });  // prunes the finished
    p2p_.push_back(message);
  }
  cv_.notify_all();
  try {
    message->post(*context_);
  } catch (const std::exception& e) {
    message->abort(fmt::format("posting it failed: {}", e.what()));  // its wait() fails
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    Reaper& reaper = reapers_[{op.peer, op.kind}];
    reaper.queue.push_back(message);
    if (!reaper.thread.joinable() && !stopping_) {
      reaper.thread =
          std::thread([this, peer = op.peer, kind = op.kind] { reap_main(peer, kind); });
    }
  }
  reap_cv_.notify_all();
  return message;
}

void Executor::reap_main(int peer, P2POp::Kind kind) {
  log::set_thread_rank(names_.global(rank_));
  pthread_setname_np(
      pthread_self(),
      fmt::format("zd-{}-{}", kind == P2POp::Kind::kSend ? "tx" : "rx", names_.global(peer))
          .substr(0, 15)
          .c_str());
  // A message younger than kReapAfter is left to its caller, who usually waits for it at once
  // and then awaits it inline (see post_p2p in executor.h).
  constexpr auto kReapAfter = std::chrono::milliseconds(2);
  std::unique_lock<std::mutex> lock(mu_);
  std::deque<std::shared_ptr<P2PMessage>>& queue = reapers_[{peer, kind}].queue;
  for (;;) {
    reap_cv_.wait(lock, [&] { return stopping_ || !queue.empty(); });
    if (queue.empty()) return;  // stopping, and every message of this direction finished
    std::shared_ptr<P2PMessage> message = std::move(queue.front());
    queue.pop_front();
    reap_cv_.wait_until(lock, message->issued() + kReapAfter,
                        [&] { return stopping_ || message->done(); });
    lock.unlock();
    message->finish();  // (returns at once when a waiting caller finished it)
    message.reset();
    lock.lock();
  }
}

std::optional<Error> Executor::p2p_ended(P2PMessage& message, const std::exception* e) {
  const P2PMessage::Spec& spec = message.spec();
  if (e == nullptr) {
    log_.ended(spec.log_id, true);
    return std::nullopt;
  }
  const auto elapsed =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - message.issued())
          .count();
  const auto where = fmt::format("{} failed on {} after {} ms (timeout {} ms)", spec.what,
                                 names_.rank_of(rank_, size_), elapsed, timeout_.count());
  const auto* ours = dynamic_cast<const Error*>(e);
  const auto* transport = dynamic_cast<const PeerError*>(e);
  Error error = transport == nullptr && (ours == nullptr || ours->kind() != ErrorKind::kPeerLost)
                    ? Error(ours ? ours->kind() : ErrorKind::kInternal,
                            fmt::format("{}: {}", where, e->what()), __FILE__, __LINE__)
                    : Error(ErrorKind::kPeerLost, fmt::format("{}: {}", where, e->what()), __FILE__,
                            __LINE__);
  if (error.kind() == ErrorKind::kPeerLost && monitor_) {
    const std::string dead = dead_peers();
    if (!dead.empty() && std::string(e->what()).find(dead) == std::string::npos) {
      error = Error(ErrorKind::kPeerLost, fmt::format("{}; {}", error.what(), dead), __FILE__,
                    __LINE__);
    }
  }
  log_.ended(spec.log_id, false);
  break_with(error.what());
  return error;
}

void Executor::break_with(const std::string& what) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.empty()) return;  // an earlier failure closed everything
    broken_ = what;
    const std::string reason = fmt::format("the communicator failed: {}", what);
    if (current_ != nullptr) current_->abort(reason);
    abort_p2p(reason, [](const P2PMessage&) { return true; });
  }
  cv_.notify_all();
  // Peers blocked on this rank fail now rather than at their timeout.
  try {
    context_->closeConnections();
  } catch (const std::exception& e) {
    spdlog::warn("closing the connections of {} failed: {}", names_.rank(rank_), e.what());
  }
  // The flight recorder: what this rank did last, for reading the ranks' logs side by side.
  spdlog::warn("{}\n  last operations of {}:{}", what, names_.rank(rank_), log_.describe_recent(8));
}

void Executor::thread_main() {
  log::set_thread_rank(names_.global(rank_));
  pthread_setname_np(pthread_self(),
                     fmt::format("zd-comm-{}", names_.global(rank_)).substr(0, 15).c_str());
  for (;;) {
    Task task;
    std::optional<Error> refused;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || (!running_ && !queue_.empty()); });
      if (stopping_) {
        std::deque<Task> left = std::move(queue_);
        queue_.clear();
        lock.unlock();
        for (auto& t : left) {
          t.work->finish(
              Error(ErrorKind::kPeerLost, fmt::format("{} did not run on {}: the communicator was "
                                                      "destroyed",
                                                      t.what, names_.rank(rank_))));
        }
        return;
      }
      task = std::move(queue_.front());
      queue_.pop_front();
      if (!broken_.empty()) {
        refused.emplace(ErrorKind::kPeerLost,
                        fmt::format("{} did not run on {}: an earlier collective failed: {}",
                                    task.what, names_.rank(rank_), broken_));
      } else {
        running_ = true;
      }
    }
    if (refused) {
      task.work->finish(std::move(refused));
    } else {
      execute(task);
    }
  }
}

void Executor::run_if_next(const GlooWork* work) {
  Task task;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || running_ || !broken_.empty() || queue_.empty() ||
        queue_.front().work.get() != work) {
      return;
    }
    task = std::move(queue_.front());
    queue_.pop_front();
    running_ = true;
  }
  execute(task);
}

void Executor::execute(Task& task) {
  const auto start = Clock::now();
  std::optional<Error> error;
  try {
    if (monitor_) monitor_->on_start(rank_, task.seq);
    log_.started(task.seq);
    Link link(*context_, task.seq, task.signature, start + timeout_, &names_);
    link.set_rate_limiter(limiter_.get());
    {
      std::lock_guard<std::mutex> lock(mu_);
      current_ = &link;
      current_since_ = Clock::now();
      if (stopping_) {
        link.abort(fmt::format("the communicator of rank {} was destroyed", names_.global(rank_)));
      }
    }
    struct Forget {  // runs before `link` is destroyed
      Executor* self;
      ~Forget() {
        std::lock_guard<std::mutex> lock(self->mu_);
        self->current_ = nullptr;
      }
    } forget{this};
    task.run(link);
    if (monitor_) monitor_->on_complete(rank_, task.seq);
    log_.ended(task.seq, true);
  } catch (const std::exception& e) {
    error = failure(task, e, start);
  }
  if (error) {
    log_.ended(task.seq, false);
    break_with(error->what());
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    running_ = false;
  }
  cv_.notify_all();
  task.work->finish(std::move(error));
}

Error Executor::failure(const Task& task, const std::exception& e, Clock::time_point start) {
  const auto elapsed =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
  const auto where = fmt::format("{} failed on {} after {} ms (timeout {} ms)", task.what,
                                 names_.rank_of(rank_, size_), elapsed, timeout_.count());
  // Lost peers: our PeerError, Gloo's exceptions (its own collectives), or a kPeerLost of ours.
  // Anything else (a bug, out of memory) keeps its kind or gets kInternal.
  const auto* ours = dynamic_cast<const Error*>(&e);
  const auto* peer = dynamic_cast<const PeerError*>(&e);
  const bool lost = peer != nullptr || dynamic_cast<const gloo::Exception*>(&e) != nullptr ||
                    dynamic_cast<const gloo::EnforceNotMet*>(&e) != nullptr ||
                    (ours != nullptr && ours->kind() == ErrorKind::kPeerLost);
  if (!lost) {
    return Error(ours ? ours->kind() : ErrorKind::kInternal, fmt::format("{}: {}", where, e.what()),
                 __FILE__, __LINE__);
  }
  std::string message = fmt::format("{}: {}", where, tidy_gloo_message(e.what()));
  if (monitor_) {
    std::string missing;
    try {
      missing = describe_missing_ranks(monitor_->snapshot(), task.seq, rank_, names_.global_ranks);
      if (missing.empty()) {
        missing = peer != nullptr && peer->timed_out()
                      ? "every other rank had started it (do the ranks issue the same "
                        "collectives with the same sizes?)"
                      : "every other rank had started it";
      }
    } catch (const std::exception& m) {
      missing = fmt::format("(the peer monitor failed: {})", m.what());
    }
    message += "; " + missing;
  }
  return Error(ErrorKind::kPeerLost, message, __FILE__, __LINE__);
}

}  // namespace zerod::gloo_backend
