// The server end of one node's Heartbeat stream: each Beat from the node is handed to the
// service, which answers with the world's status; the service also pushes every change of
// the world to all streams. One write is in flight at a time; a newer status replaces one
// still waiting to be written. A stream that ends without the node having left (the process
// died, its connection broke) tells the service at once.
//
// Lifetime: gRPC holds one reference until OnDone; the service takes another while it pushes
// to the stream outside its lock. The stream deletes itself when the last one goes.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <mutex>
#include <optional>

#include "zerod.grpc.pb.h"

namespace zerod {

class RendezvousService;

class HeartbeatStream final : public grpc::ServerBidiReactor<v1::Beat, v1::WorldStatus> {
 public:
  explicit HeartbeatStream(RendezvousService* service);

  // Sends status (after the write in flight, if any; a newer status replaces an unsent one).
  void push(const v1::WorldStatus& status);
  // Ends the stream with status once the write in flight is done. Idempotent.
  void finish(const grpc::Status& status);

  void ref() { refs_.fetch_add(1, std::memory_order_relaxed); }
  void unref();

  // The node this stream beats for (-1 until its first beat is accepted). Service lock only.
  int node_rank = -1;

 private:
  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone() override;

  RendezvousService* const service_;
  std::atomic<int> refs_{1};
  v1::Beat in_;  // only the reading side touches it

  std::mutex mu_;
  v1::WorldStatus out_;                  // the write in flight
  std::optional<v1::WorldStatus> next_;  // the next one
  bool writing_ = false;
  bool finishing_ = false;  // finish() was asked
  bool finished_ = false;   // Finish() was called
  grpc::Status final_;
};

}  // namespace zerod
