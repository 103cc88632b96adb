// The ranks of one Gloo communicator that all live in this process (threads: every zerod node
// runs its local ranks as threads, and tests and benchmarks run whole worlds so) read each
// other's buffers directly instead of sending them through loopback TCP (comm/gloo/shared.cc).
//
// Whether they do is decided once, when the communicator is created: each rank publishes this
// process's token (pid, host and a random number drawn once per process) in the communicator's
// store; when every rank's token is this process's, rank 0 registers a SharedGroup in a
// process-wide table and publishes its id, and the others take it from there. Every rank comes to
// the same answer (the same n tokens), so every rank picks the same algorithms.
//
// The SharedGroup makes direct reads safe when a collective fails half-way: a rank that reads a
// peer's buffer first marks itself as its reader, and only while the peer is still inside that
// collective; a rank that leaves a collective (normally, after its last barrier, when nobody
// reads any more; or by an error, when a peer may still be reading) waits until no reader is
// left before its caller may free or reuse the memory. Reads are plain memory copies and
// reductions, so that wait is short and never depends on another rank making progress.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "comm/store.h"

namespace zerod::gloo_backend {

class SharedGroup {
 public:
  explicit SharedGroup(int size);

  // Owner side. This rank is inside collective `seq` (its buffers may be read).
  void enter(int rank, int64_t seq);
  // This rank leaves its collective: no new reader may start, and it returns once the current
  // ones are done.
  void leave(int rank);

  // Reader side: this rank starts reading `owner`'s buffers of collective `seq`; false (nothing
  // may be read) when the owner is no longer inside it (its collective failed).
  bool begin_read(int owner, int64_t seq);
  void end_read(int owner);

 private:
  struct alignas(64) Slot {
    std::atomic<int64_t> active{-1};  // the collective the owner is inside, -1: none
    std::atomic<int> readers{0};
  };
  int size_;
  std::unique_ptr<Slot[]> slots_;
};

// The SharedGroup of a communicator being created (rank `rank` of `size`, its prefixed store),
// or null when some rank is in another process (or size is 1). Collective over the communicator's
// ranks through the store; waits for each key up to `timeout` (Error kPeerLost naming it).
std::shared_ptr<SharedGroup> join_shared_group(Store& store, int rank, int size,
                                               std::chrono::milliseconds timeout);

// While alive, `rank` is inside collective `seq` of `group` (leave() on every exit).
class SharedScope {
 public:
  SharedScope(SharedGroup& group, int rank, int64_t seq) : group_(group), rank_(rank) {
    group_.enter(rank, seq);
  }
  ~SharedScope() { group_.leave(rank_); }
  SharedScope(const SharedScope&) = delete;
  SharedScope& operator=(const SharedScope&) = delete;

 private:
  SharedGroup& group_;
  int rank_;
};

}  // namespace zerod::gloo_backend
