#include "comm/gloo/p2p.h"

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <functional>

#include "comm/gloo/executor.h"

namespace zerod::gloo_backend {

namespace {

// Slots of messages: 0x5C in bits 56-63 (our collectives use 0x5A, the connection watcher 0x5B,
// Gloo's collectives 0x01-0x08); bit 55 set for a payload, whose bits 32-54 hold a digest of its
// size; bits 0-31 the message's number in its direction.
constexpr uint64_t kP2PPrefix = 0x5Cull << 56;
constexpr uint64_t kPayloadBit = 1ull << 55;
constexpr uint32_t kMagic = 0x5A503250;  // "ZP2P"

uint64_t header_slot(uint32_t index) {
  return kP2PPrefix | index;
}

uint64_t payload_slot(uint32_t index, size_t bytes) {
  const uint64_t digest = std::hash<uint64_t>{}(bytes) & ((1ull << 23) - 1);
  return kP2PPrefix | kPayloadBit | (digest << 32) | index;
}

}  // namespace

P2PMessage::P2PMessage(Spec spec, void* data, Clock::time_point deadline,
                       std::weak_ptr<Executor> owner)
    : spec_(std::move(spec)),
      data_(data),
      issued_(Clock::now()),
      deadline_(deadline),
      owner_(std::move(owner)) {}

P2PMessage::~P2PMessage() = default;

void P2PMessage::post(gloo::Context& context) {
  const bool send = spec_.kind == P2POp::Kind::kSend;
  if (send) header_ = Header{kMagic, spec_.tag, spec_.bytes};
  auto header = context.createUnboundBuffer(&header_, sizeof(Header));
  std::unique_ptr<gloo::transport::UnboundBuffer> payload;
  if (spec_.bytes > 0) payload = context.createUnboundBuffer(data_, spec_.bytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    header_buf_ = std::move(header);
    payload_buf_ = std::move(payload);
    if (aborted_) return;  // wait() fails with the reason
  }
  try {
    if (send) {
      header_buf_->send(spec_.peer, header_slot(spec_.index));
      if (payload_buf_) payload_buf_->send(spec_.peer, payload_slot(spec_.index, spec_.bytes));
    } else {
      header_buf_->recv(spec_.peer, header_slot(spec_.index));
      if (payload_buf_) payload_buf_->recv(spec_.peer, payload_slot(spec_.index, spec_.bytes));
    }
  } catch (const std::exception& e) {
    throw PeerError(spec_.peer, false, tidy_gloo_message(e.what()));
  }
}

void P2PMessage::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_ || done_) return;
  aborted_ = true;
  abort_reason_ = reason;
  for (auto* b : {header_buf_.get(), payload_buf_.get()}) {
    if (b == nullptr) continue;
    b->abortWaitRecv();
    b->abortWaitSend();
  }
}

bool P2PMessage::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void P2PMessage::wait() {
  finish();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
  if (error_) throw *error_;
}

void P2PMessage::finish() {
  bool run = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_ && !waiting_) run = waiting_ = true;
  }
  if (run) {
    std::optional<Error> error;
    auto owner = owner_.lock();
    try {
      complete();
      if (owner) owner->p2p_ended(*this, nullptr);
    } catch (const std::exception& e) {
      error = owner ? owner->p2p_ended(*this, &e)
                    : Error(ErrorKind::kPeerLost,
                            fmt::format("{} failed: the communicator was destroyed", spec_.what),
                            __FILE__, __LINE__);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
      error_ = std::move(error);
    }
    cv_.notify_all();
  }
}

void P2PMessage::complete() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) throw PeerError(spec_.peer, false, abort_reason_);
  }
  wait_buffer(*header_buf_);
  if (spec_.kind == P2POp::Kind::kRecv) check_header();
  if (payload_buf_) wait_buffer(*payload_buf_);
}

void P2PMessage::wait_buffer(gloo::transport::UnboundBuffer& buf) {
  const bool send = spec_.kind == P2POp::Kind::kSend;
  const auto left =
      std::max(std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now()),
               std::chrono::milliseconds(1));
  bool ok = false;
  std::string why;
  try {
    ok = send ? buf.waitSend(nullptr, left) : buf.waitRecv(nullptr, left);
  } catch (const std::exception& e) {
    why = tidy_gloo_message(e.what());
  }
  if (ok) return;
  // Past the deadline it is a timeout, also when the executor's watcher aborted the message first
  // (Gloo closes the pair of an operation that timed out, which the watcher sees).
  const bool timed_out = Clock::now() + std::chrono::milliseconds(5) >= deadline_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_ && !timed_out) throw PeerError(spec_.peer, false, abort_reason_);
  }
  if (timed_out) {
    throw PeerError(spec_.peer, true,
                    fmt::format("timed out: the peer {} within the timeout{}",
                                send ? "posted no matching receive" : "sent no matching message",
                                why.empty() ? "" : " (" + why + ")"));
  }
  throw PeerError(spec_.peer, false, why.empty() ? "the wait was aborted" : why);
}

void P2PMessage::check_header() const {
  ZD_CHECK(header_.magic == kMagic, "{}: the peer's header is not a zerod message (magic {:#x})",
           spec_.what, header_.magic);
  ZD_CHECK(
      header_.bytes == spec_.bytes && header_.tag == spec_.tag,
      "{}: size or tag mismatch: the peer sent {} bytes with tag {} as its message #{} in this "
      "direction, this receive expects {} bytes with tag {} (do both ranks run the same "
      "schedule?)",
      spec_.what, header_.bytes, header_.tag, spec_.index + 1, spec_.bytes, spec_.tag);
}

}  // namespace zerod::gloo_backend
