#include "engine/runtime/grpc/heartbeat_stream.h"

#include "engine/runtime/grpc/rendezvous_service.h"

namespace zerod {

HeartbeatStream::HeartbeatStream(RendezvousService* service) : service_(service) {
  StartRead(&in_);
}

void HeartbeatStream::unref() {
  if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
}

void HeartbeatStream::push(const v1::WorldStatus& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finishing_) return;
    if (writing_) {
      next_ = status;
      return;
    }
    writing_ = true;
    out_ = status;
  }
  StartWrite(&out_);
}

void HeartbeatStream::finish(const grpc::Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finishing_) return;
    finishing_ = true;
    final_ = status;
    next_.reset();
    if (writing_) return;  // OnWriteDone finishes
    finished_ = true;
  }
  Finish(status);
}

void HeartbeatStream::OnReadDone(bool ok) {
  if (!ok) {  // the node closed its side, or the call broke or was cancelled
    service_->on_stream_end(this);
    finish(grpc::Status::OK);
    return;
  }
  v1::WorldStatus reply;
  const grpc::Status st = service_->on_beat(this, in_, &reply);
  if (!st.ok()) {
    finish(st);
    return;
  }
  push(reply);
  StartRead(&in_);
}

void HeartbeatStream::OnWriteDone(bool ok) {
  bool write = false;
  bool finish_now = false;
  grpc::Status status;
  {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (finishing_) {
      if (!finished_) {
        finished_ = true;
        finish_now = true;
        status = final_;
      }
    } else if (ok && next_) {
      out_ = std::move(*next_);
      next_.reset();
      writing_ = true;
      write = true;
    }
  }
  // A failed write means the call is broken: the pending read fails too and finishes it.
  if (write) StartWrite(&out_);
  if (finish_now) Finish(status);
}

void HeartbeatStream::OnDone() {
  service_->on_stream_done(this);
  unref();
}

}  // namespace zerod
