// Runs the collectives of one Gloo communicator in issue order (comm/gloo/): a queue, the
// communication thread, and the works callers wait on.
//
// A collective normally runs on the communication thread, so callers overlap it with compute.
// A caller that waits for a collective which has not started yet, while nothing else runs, runs
// it itself instead (saving two thread hand-offs for the synchronous forms); either way one
// collective runs at a time, in sequence order.
//
// The first failure breaks the executor: the failed collective's error names the operation,
// its sequence number and size, the world, the reason, and the ranks the PeerMonitor says had
// not arrived; every connection is then closed so that peers blocked on this rank fail at once;
// queued collectives fail without running, and later submissions throw at once. shutdown()
// aborts a running collective and waits for it (never for peers).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/collective_log.h"
#include "comm/communicator.h"
#include "comm/gloo/link.h"
#include "comm/peer_monitor.h"
#include "comm/rank_names.h"
#include "core/error.h"

namespace gloo {
class Context;
}

namespace gloo::transport {
class UnboundBuffer;
}

namespace zerod::gloo_backend {

class GlooWork;
class P2PMessage;

class Executor : public std::enable_shared_from_this<Executor> {
 public:
  // Starts the communication thread. `context` is connected; `monitor` may be null; `names`:
  // how messages name the ranks (empty for a world's communicator, see comm/rank_names.h).
  static std::shared_ptr<Executor> start(std::shared_ptr<gloo::Context> context,
                                         std::chrono::milliseconds timeout,
                                         std::shared_ptr<PeerMonitor> monitor,
                                         RankNames names = {});
  ~Executor();

  // Numbers the collective and queues it. `op` and `detail` name it in errors ("all_reduce",
  // "1001 x f32, sum") and, hashed, keep mismatched collectives of different ranks apart, so
  // they must read the same on every rank; `local` (may be empty) adds what differs between
  // ranks ("to rank 2, from rank 0") to the name, not to the hash.
  // Throws Error(kPeerLost) at once when an earlier collective failed.
  // `bytes`: the operation's size for the collective log (collective_log.h).
  WorkPtr submit(const char* op, const std::string& detail, int64_t bytes,
                 std::function<void(Link&)> run, const std::string& local = {});
  const CollectiveLog& log() const { return log_; }

  // A point-to-point message (p2p.h), checked by the caller: posted now, outside the queue. It
  // takes no sequence number; the log records it as "send" / "recv". While in flight it is
  // aborted, like a running collective, by the connection watcher, the dead-peer sentinel,
  // shutdown() and any failure that breaks the executor. Its completion is awaited by the caller
  // of wait() or, whichever comes first, by the reaper thread of its peer and direction (one per
  // pair and direction in use, started at its first message), so that done() turns true and a
  // failure breaks the communicator even when nobody waits. Within one direction to one peer
  // messages complete in issue order, so a reaper never waits behind something that depends on
  // the caller. The reaper leaves a message alone for its first 2 ms (a caller waiting at once
  // awaits it inline, a thread hand-off less), so done() may lag completion by that much.
  // zerod_comm_bench "send" (2 processes on 127.0.0.1, a message and an empty answer; the 2-core
  // VM shared with other work): 64 KB 0.25-0.30 GB/s with the delay in 4 runs, 0.31 and twice
  // 0.017 GB/s without it (4 ms stalls, which the collectives of the same runs also showed at
  // times); 16-64 MB 2.0-2.5 GB/s, 83-87% of the plain TCP stream. `detail`: "1024 x f32".
  // Throws Error(kPeerLost) at once when the executor is broken.
  WorkPtr post_p2p(const P2POp& op, size_t bytes, const std::string& detail);
  // Called once by a message's waiter when it finished: logs it, forgets it and, for `e` (its
  // failure), returns the error its wait() throws and breaks the executor.
  std::optional<Error> p2p_ended(P2PMessage& message, const std::exception* e);

  int64_t sequence() const;
  // Every later collective's sends go through `limiter` (null: none). Call before submitting.
  void set_rate_limiter(std::shared_ptr<RateLimiter> limiter) { limiter_ = std::move(limiter); }
  // Idempotent; after it, submit() throws and queued works have failed.
  void shutdown();

 private:
  std::shared_ptr<RateLimiter> limiter_;
  friend class GlooWork;
  struct Task {
    std::shared_ptr<GlooWork> work;
    int64_t seq = 0;
    uint16_t signature = 0;
    std::string what;  // "all_reduce #5 (1001 x f32, sum)"
    std::function<void(Link&)> run;
  };

  Executor(std::shared_ptr<gloo::Context> context, std::chrono::milliseconds timeout,
           std::shared_ptr<PeerMonitor> monitor, RankNames names);
  void thread_main();
  // The connection watcher (size > 1). Gloo's TCP pair does not fail an unbound-buffer send
  // whose bytes are queued on it when the connection then closes (it signals the queued sends
  // of bound buffers only), so such a send would wait for the whole timeout. The watcher keeps
  // one receive posted to every peer on a slot nobody sends to and blocks on it; a pair that
  // fails signals that receive too. From then on, a collective that has run for kStuckAfter is
  // aborted with the pair's error. (Not at once: a peer that finished the last collective and
  // closed its connections must not fail ours, which is completing.)
  void watch_main();
  // The dead-peer sentinel (size > 1, with a monitor): while a collective has run for a while it
  // asks the monitor every kSentinelPeriod whether a peer of this communicator is dead (a rank
  // thread that failed, or a node the rendezvous declared dead when its heartbeats stopped, e.g.
  // a SIGSTOPped or hung process whose connections stay open) and aborts the collective naming
  // it, so peers exit within the heartbeat timeout instead of the collective timeout.
  void sentinel_main();
  // Runs `work`'s task in the calling thread if it is next and nothing runs.
  void run_if_next(const GlooWork* work);
  // Runs a task taken off the queue (running_ is set); clears running_ when done.
  void execute(Task& task);
  Error failure(const Task& task, const std::exception& e, Clock::time_point start);
  // The first failure (`what`): later submissions throw; the running collective and the messages
  // in flight are aborted; every connection closes (peers blocked on this rank fail now rather
  // than at their timeout); the flight recorder is written to the log.
  void break_with(const std::string& what);
  // Under mu_: aborts the messages in flight for which `stuck(message)` holds; prunes the finished.
  template <class Stuck>
  void abort_p2p(const std::string& reason, Stuck stuck);
  // The reaper of messages to / from `peer` (see post_p2p); returns at shutdown.
  void reap_main(int peer, P2POp::Kind kind);
  // The dead ranks the monitor knows of ("rank 3 is dead (killed)"), or "" (never under mu_).
  std::string dead_peers();
  // A peer in messages: "rank 3", or "rank 5 (group rank 1)" in a sub-group.
  std::string peer(int r) const;

  const std::shared_ptr<gloo::Context> context_;
  const int rank_;
  const int size_;
  const std::chrono::milliseconds timeout_;
  const std::shared_ptr<PeerMonitor> monitor_;
  const RankNames names_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  int64_t seq_ = 0;
  bool running_ = false;     // a task runs (on the thread or inline)
  Link* current_ = nullptr;  // its Link, once it has one
  Clock::time_point current_since_{};
  gloo::transport::UnboundBuffer* probe_ = nullptr;  // the watcher's receive, while it waits
  bool stopping_ = false;
  std::string broken_;  // the first failure; non-empty: submissions throw
  // Point-to-point: the messages in flight, and the number of the next message to / from each
  // rank.
  std::vector<std::weak_ptr<P2PMessage>> p2p_;
  std::vector<uint32_t> sent_, received_;
  int64_t p2p_ids_ = 0;
  struct Reaper {
    std::deque<std::shared_ptr<P2PMessage>> queue;  // posted, in index order
    std::thread thread;
  };
  std::map<std::pair<int, P2POp::Kind>, Reaper> reapers_;
  std::condition_variable reap_cv_;
  CollectiveLog log_;
  std::thread thread_;
  std::thread watcher_;
  std::thread sentinel_;
};

}  // namespace zerod::gloo_backend
