#include "comm/gloo/link.h"

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <cstring>

#include <fmt/format.h>

namespace zerod::gloo_backend {

namespace {

// Slots of our collectives: 0x5A in bits 56-63 keeps them apart from the slots of Gloo's
// collectives (prefixes 0x01-0x08 in gloo/types.h); then the signature (bits 40-55), the
// sequence number (bits 8-39) and the channel (bits 0-7).
constexpr uint64_t kSlotPrefix = 0x5Aull << 56;

bool is_timeout(const char* what) {
  return std::strstr(what, "Timed out") != nullptr || std::strstr(what, "timeout") != nullptr;
}

}  // namespace

std::string tidy_gloo_message(const std::string& msg) {
  if (msg.empty() || msg[0] != '[') return msg;
  const auto close = msg.find("] ");
  if (close == std::string::npos) return msg;
  const auto slash = msg.rfind('/', close);
  if (slash == std::string::npos) return msg;
  std::string out(1, '[');
  out.append(msg, slash + 1, std::string::npos);
  return out;
}

Link::Link(gloo::Context& context, int64_t seq, uint16_t signature, Clock::time_point deadline,
           const RankNames* names)
    : context_(context),
      rank_(context.rank),
      size_(context.size),
      seq_(seq),
      slot_base_(kSlotPrefix | (static_cast<uint64_t>(signature) << 40) |
                 ((static_cast<uint64_t>(seq) & 0xffffffffull) << 8)),
      deadline_(deadline),
      names_(names) {}

Link::~Link() = default;

uint64_t Link::slot(int channel) const {
  return slot_base_ | static_cast<uint64_t>(channel & 0xff);
}

std::chrono::milliseconds Link::remaining() const {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

Buffer Link::buffer(const void* ptr, size_t bytes) {
  // Gloo's buffers take void*; we only write through the buffers we receive into.
  auto buf = context_.createUnboundBuffer(const_cast<void*>(ptr), bytes);
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) {  // its waits fail at once
    buf->abortWaitRecv();
    buf->abortWaitSend();
  }
  buffers_.push_back(std::move(buf));
  return buffers_.back().get();
}

void Link::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) return;
  aborted_ = true;
  abort_reason_ = reason;
  for (auto& b : buffers_) {
    b->abortWaitRecv();
    b->abortWaitSend();
  }
}

void Link::throw_if_aborted(int peer, const char* what) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) {
    throw PeerError(peer, false,
                    fmt::format("{} rank {} was aborted: {}", what, name(peer), abort_reason_));
  }
}

void Link::fail(int peer, const char* what, const std::exception* e) {
  throw_if_aborted(peer, what);  // an abort explains any failure that follows it
  if (e == nullptr) {
    throw PeerError(peer, false, fmt::format("{} rank {} was aborted", what, name(peer)));
  }
  throw PeerError(
      peer, is_timeout(e->what()),
      fmt::format("{} rank {} failed: {}", what, name(peer), tidy_gloo_message(e->what())));
}

void Link::send(Buffer buf, int peer, size_t offset, size_t bytes, int channel) {
  throw_if_aborted(peer, "sending to");
  if (limiter_ != nullptr && limiter_->applies_to(name(peer))) limiter_->acquire(bytes);
  try {
    buf->send(peer, slot(channel), offset, bytes);
  } catch (const std::exception& e) {
    fail(peer, "sending to", &e);
  }
}

void Link::recv(Buffer buf, int peer, size_t offset, size_t bytes, int channel) {
  throw_if_aborted(peer, "receiving from");
  try {
    buf->recv(peer, slot(channel), offset, bytes);
  } catch (const std::exception& e) {
    fail(peer, "receiving from", &e);
  }
}

void Link::wait_send(Buffer buf, int peer) {
  bool ok = false;
  try {
    ok = buf->waitSend(nullptr, remaining());
  } catch (const std::exception& e) {
    fail(peer, "sending to", &e);
  }
  if (!ok) fail(peer, "sending to", nullptr);
}

void Link::wait_recv(Buffer buf, int peer) {
  bool ok = false;
  try {
    ok = buf->waitRecv(nullptr, remaining());
  } catch (const std::exception& e) {
    fail(peer, "receiving from", &e);
  }
  if (!ok) fail(peer, "receiving from", nullptr);
}

}  // namespace zerod::gloo_backend
