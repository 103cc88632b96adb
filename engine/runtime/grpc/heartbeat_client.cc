#include "engine/runtime/grpc/heartbeat_client.h"

#include <fmt/format.h>

#include "core/timer.h"
#include "engine/runtime/grpc/channel.h"

namespace zerod {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

}  // namespace

HeartbeatClient::HeartbeatClient(v1::Rendezvous::Stub& stub, int node_rank, std::string session_id,
                                 std::shared_ptr<WorldMonitor> monitor,
                                 std::chrono::milliseconds interval, int misses, Handlers handlers)
    : node_rank_(node_rank),
      session_id_(std::move(session_id)),
      monitor_(std::move(monitor)),
      interval_(interval),
      misses_(misses),
      handlers_(std::move(handlers)) {
  prepare_context(ctx_, std::chrono::hours(24 * 365));  // lives as long as the job
  // Names the node before its first beat, so that a stream broken at once is still its death.
  ctx_.AddMetadata(std::string(kNodeRankMetadata), std::to_string(node_rank_));
  ctx_.AddMetadata(std::string(kSessionMetadata), session_id_);
  stream_ = stub.Heartbeat(&ctx_);
  last_reply_ns_ = now_ns();
  writer_ = std::thread([this] { write_loop(); });
  reader_ = std::thread([this] { read_loop(); });
}

HeartbeatClient::~HeartbeatClient() {
  cut();
}

v1::Beat HeartbeatClient::make_beat() {
  v1::Beat beat;
  beat.set_node_rank(node_rank_);
  beat.set_session_id(session_id_);
  const std::vector<RankProgress> local = monitor_->local_progress();
  const int first = monitor_->first_local_rank();
  for (size_t i = 0; i < local.size(); ++i) {
    v1::RankProgress* p = beat.add_ranks();
    p->set_rank(first + static_cast<int>(i));
    p->set_started(local[i].started);
    p->set_completed(local[i].completed);
    p->set_alive(local[i].alive);
    p->set_reason(local[i].reason);
  }
  return beat;
}

void HeartbeatClient::write_loop() {
  const auto silence_limit = interval_ * misses_;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_ && !read_done_) {
    lock.unlock();
    const bool ok = stream_->Write(make_beat());
    lock.lock();
    if (!ok) break;  // the stream is over; the reader learns why
    cv_.wait_for(lock, interval_, [this] { return stop_ || read_done_; });
    if (stop_ || read_done_) break;
    const auto silent = std::chrono::nanoseconds(now_ns() - last_reply_ns_.load());
    if (silent > silence_limit) {
      silence_ = fmt::format("no status from the master for {} ms (limit {} ms)",
                             std::chrono::duration_cast<std::chrono::milliseconds>(silent).count(),
                             silence_limit.count());
      lock.unlock();
      ctx_.TryCancel();
      lock.lock();
      break;
    }
  }
  const bool close = stop_ && !cut_;
  lock.unlock();
  if (close) stream_->WritesDone();
  lock.lock();
  writer_done_ = true;
  cv_.notify_all();
}

void HeartbeatClient::read_loop() {
  v1::WorldStatus status;
  while (stream_->Read(&status)) {
    last_reply_ns_ = now_ns();
    if (handlers_.on_status) handlers_.on_status(status);
  }
  std::unique_lock<std::mutex> lock(mu_);
  read_done_ = true;
  cv_.notify_all();
  cv_.wait(lock, [this] { return writer_done_; });  // Finish only once no Write is running
  lock.unlock();
  const grpc::Status st = stream_->Finish();
  lock.lock();
  const bool expected = stop_;
  const std::string why = silence_.empty() ? describe_status(st) : silence_;
  reader_done_ = true;
  cv_.notify_all();
  lock.unlock();
  if (!expected && handlers_.on_lost) handlers_.on_lost(why);
}

void HeartbeatClient::join_threads() {
  if (writer_.joinable()) writer_.join();
  if (reader_.joinable()) reader_.join();
}

void HeartbeatClient::stop(std::chrono::milliseconds grace) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!stop_) {
    stop_ = true;
    cv_.notify_all();
  }
  if (!cv_.wait_for(lock, grace, [this] { return reader_done_; })) {
    lock.unlock();
    ctx_.TryCancel();  // the master did not close its side in time
    lock.lock();
  }
  lock.unlock();
  join_threads();
}

void HeartbeatClient::cut() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stop_) {
      stop_ = true;
      cut_ = true;
    }
    cv_.notify_all();
  }
  ctx_.TryCancel();
  join_threads();
}

}  // namespace zerod
