// The point-to-point layer under our collectives (comm/gloo/): Gloo's unbound buffers over its
// TCP pairs, with the collective's deadline applied to every wait and the peer rank named in
// every failure (PeerError). One Link per collective; it owns the buffers it hands out, and
// once it is destroyed Gloo no longer touches the memory they covered. Its slots (Gloo's tags)
// derive from the collective's sequence number and a signature of its operation and size, with a
// few channels per collective: ranks that disagree about the k-th collective (a bug in the
// caller) never match each other's messages, so they time out with an error instead of
// overrunning buffers (which Gloo's event loop answers with std::terminate).
//
// abort() (from any thread) makes every current and later wait of the Link fail at once; the
// communicator uses it to stop a collective whose communicator is being destroyed.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/gloo/rate_limiter.h"
#include "comm/rank_names.h"

namespace gloo {
class Context;
namespace transport {
class UnboundBuffer;
}
}  // namespace gloo

namespace zerod::gloo_backend {

using Clock = std::chrono::steady_clock;
using Buffer = gloo::transport::UnboundBuffer*;

// A send to or receive from `peer` failed: Gloo's reason, our deadline, or an abort.
class PeerError : public std::runtime_error {
 public:
  PeerError(int peer, bool timed_out, const std::string& what)
      : std::runtime_error(what), peer_(peer), timed_out_(timed_out) {}
  int peer() const { return peer_; }
  bool timed_out() const { return timed_out_; }

 private:
  int peer_;
  bool timed_out_;
};

// Gloo's messages start with "[/full/path/to/file.cc:123] "; this keeps the file name only.
std::string tidy_gloo_message(const std::string& msg);

class Link {
 public:
  // `signature`: any 16-bit digest of the operation, type, count and root. `names` (may be null:
  // ranks as they are; else it must outlive the Link) names the peers in errors.
  Link(gloo::Context& context, int64_t seq, uint16_t signature, Clock::time_point deadline,
       const RankNames* names = nullptr);
  ~Link();
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int64_t seq() const { return seq_; }
  // Gloo's tag for its own collectives: the low 32 bits of the sequence number.
  uint32_t tag() const { return static_cast<uint32_t>(seq_); }
  // Time left before the deadline (at least 1 ms, so that Gloo still checks once).
  std::chrono::milliseconds remaining() const;

  // A view of `bytes` bytes at `ptr` for sends and receives (several may be pending on one);
  // valid until the Link is destroyed.
  Buffer buffer(const void* ptr, size_t bytes);
  // Posts a send/receive of `bytes` at `offset` of `buf` on `channel` (0-255); they match the
  // peer's receives/sends on the same channel in posting order.
  void send(Buffer buf, int peer, size_t offset, size_t bytes, int channel);
  void recv(Buffer buf, int peer, size_t offset, size_t bytes, int channel);
  // Waits for the next completed send/receive of `buf` (in posting order).
  void wait_send(Buffer buf, int peer);
  void wait_recv(Buffer buf, int peer);

  void abort(const std::string& reason);
  // Paces every later send through `limiter` (rate_limiter.h; not owned; null: none).
  void set_rate_limiter(RateLimiter* limiter) { limiter_ = limiter; }

 private:
  uint64_t slot(int channel) const;
  void throw_if_aborted(int peer, const char* what);
  [[noreturn]] void fail(int peer, const char* what, const std::exception* e);
  int name(int peer) const { return names_ != nullptr ? names_->global(peer) : peer; }

  gloo::Context& context_;
  const int rank_;
  const int size_;
  const int64_t seq_;
  const uint64_t slot_base_;
  const Clock::time_point deadline_;
  const RankNames* const names_;
  RateLimiter* limiter_ = nullptr;

  std::mutex mu_;
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> buffers_;
  bool aborted_ = false;
  std::string abort_reason_;
};

}  // namespace zerod::gloo_backend
