// The communicator of a world of one rank (comm/self/): every collective completes at once in
// the calling thread (a copy when the output is not the input), and still takes the next
// sequence number, so code and logs look the same at any world size. Works on host memory, or
// on any memory given a `copy` that can move it (a GPU backend's copy for device buffers).
#pragma once

#include <functional>
#include <memory>

#include "comm/communicator.h"
#include "comm/peer_monitor.h"

namespace zerod {

class SelfCommunicator : public Communicator {
 public:
  using Copy = std::function<void(void* dst, const void* src, size_t bytes)>;
  // `monitor` (may be null) gets on_start/on_complete for rank 0. `copy` moves the bytes of a
  // collective whose output is not its input (null: memmove, host memory only); it must be done
  // when it returns.
  explicit SelfCommunicator(std::chrono::milliseconds timeout = std::chrono::minutes(5),
                            std::shared_ptr<PeerMonitor> monitor = nullptr, Copy copy = nullptr);

  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* backend() const override { return "self"; }
  int64_t sequence() const override { return seq_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  WorkPtr all_reduce_async(void* data, int64_t count, CommType type, ReduceOp op) override;
  WorkPtr reduce_scatter_async(const void* send, void* recv, int64_t count, CommType type,
                               ReduceOp op) override;
  WorkPtr all_gather_async(const void* send, void* recv, int64_t count, CommType type) override;
  WorkPtr broadcast_async(void* data, int64_t count, CommType type, int root) override;
  WorkPtr barrier_async() override;
  // recv (count) = send (count): the one block goes to this rank.
  WorkPtr all_to_all_async(const void* send, void* recv, int64_t count, CommType type) override;
  // dst and src are both 0 (recv = send) or both kNoPeer (nothing moves).
  WorkPtr send_recv_async(const void* send, int dst, void* recv, int src, int64_t count,
                          CommType type) override;
  // Point to point: a world of one has no peer, and a rank never sends to itself, so every call
  // throws Error(kInternal) naming the peer (checked_p2p_bytes); nothing is numbered.
  WorkPtr send_async(const void* data, int64_t count, CommType type, int dst, int tag) override;
  WorkPtr recv_async(void* data, int64_t count, CommType type, int src, int tag) override;

 private:
  // Numbers the collective, reports it, copies `bytes` from src to dst when they differ, and
  // returns a done Work.
  WorkPtr complete(const void* src, void* dst, size_t bytes);

  std::chrono::milliseconds timeout_;
  std::shared_ptr<PeerMonitor> monitor_;
  Copy copy_;
  int64_t seq_ = 0;
};

}  // namespace zerod
