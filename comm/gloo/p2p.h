// One point-to-point message of a Gloo communicator (communicator.h: send_async / recv_async),
// on Gloo's unbound buffers, outside the executor's queue of collectives: it is posted in the
// issuing thread at once (Gloo's send and recv only post), so messages in flight never wait for
// each other or for a collective, and awaited by whichever comes first of a caller of wait() and
// the executor's reaper thread for its peer and direction (so done() turns true unasked).
//
// Wire: each message is a 16-byte header (a magic number, the tag, the byte size) and, when the
// size is not zero, the payload. The k-th message from a to b travels on slots numbered k (per
// ordered pair, so matching is by order); the header's slot carries k only, the payload's also a
// digest of its size. A receive whose size differs from the sender's thus never matches the
// payload (Gloo's event loop answers an overrun with std::terminate), while the header arrives and
// the receiver fails with both sizes named; a tag differing from the receiver's fails the same
// way.
//
// Errors: Gloo's failure of a pair, a timeout (`deadline`: the issue time plus the communicator's
// timeout) or an abort (the executor aborts messages in flight when a peer is dead, a connection
// failed, another operation broke the communicator or it is destroyed) make wait() throw what the
// executor makes of it (Executor::p2p_failure).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "comm/communicator.h"
#include "comm/gloo/link.h"
#include "core/error.h"

namespace gloo {
class Context;
}

namespace zerod::gloo_backend {

class Executor;

class P2PMessage final : public Work {
 public:
  struct Spec {
    P2POp::Kind kind = P2POp::Kind::kSend;
    int peer = 0;
    int tag = 0;
    size_t bytes = 0;
    uint32_t index = 0;  // k: this message's number between the two ranks, in its direction
    int64_t log_id = 0;  // its id in the collective log (negative)
    std::string what;    // "recv #3 from rank 1 (tag 7, 1024 x f32, 4096 bytes)"
  };

  P2PMessage(Spec spec, void* data, Clock::time_point deadline, std::weak_ptr<Executor> owner);
  ~P2PMessage() override;

  // Posts the header and the payload on `context` (throws PeerError when a pair has failed).
  void post(gloo::Context& context);

  void wait() override;
  bool done() const override;
  // Awaits the message's completion unless another thread does (its waiter or its reaper); then
  // it is done, and the executor has heard of it. Never throws.
  void finish();
  // Messages take no sequence number: their (negative) id in the collective log.
  int64_t sequence() const override { return spec_.log_id; }

  // Makes a current or later wait fail at once with `reason` (any thread; idempotent).
  void abort(const std::string& reason);
  const Spec& spec() const { return spec_; }
  Clock::time_point issued() const { return issued_; }

 private:
  struct Header {
    uint32_t magic = 0;
    int32_t tag = 0;
    uint64_t bytes = 0;
  };
  // Waits for the header and the payload; throws PeerError (transport) or Error (mismatch).
  void complete();
  void wait_buffer(gloo::transport::UnboundBuffer& buf);
  void check_header() const;

  const Spec spec_;
  void* const data_;
  const Clock::time_point issued_;
  const Clock::time_point deadline_;
  const std::weak_ptr<Executor> owner_;
  Header header_;  // ours (send) or the peer's (recv)
  std::unique_ptr<gloo::transport::UnboundBuffer> header_buf_;
  std::unique_ptr<gloo::transport::UnboundBuffer> payload_buf_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool waiting_ = false;  // a caller runs complete()
  bool done_ = false;
  bool aborted_ = false;
  std::string abort_reason_;
  std::optional<Error> error_;
};

}  // namespace zerod::gloo_backend
