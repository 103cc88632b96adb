// The node end of the Heartbeat stream: a writer thread sends this node's ranks' progress
// every interval; a reader thread hands each WorldStatus from the master to on_status. When
// the stream ends without stop() -- the master died, the connection broke, or the master
// stayed silent for `misses` intervals -- on_lost is called once with the reason.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "engine/runtime/world_monitor.h"
#include "zerod.grpc.pb.h"

namespace zerod {

class HeartbeatClient {
 public:
  struct Handlers {
    std::function<void(const v1::WorldStatus&)> on_status;  // reader thread
    std::function<void(const std::string& why)> on_lost;    // reader thread, at most once
  };

  HeartbeatClient(v1::Rendezvous::Stub& stub, int node_rank, std::string session_id,
                  std::shared_ptr<WorldMonitor> monitor, std::chrono::milliseconds interval,
                  int misses, Handlers handlers);
  ~HeartbeatClient();  // cut() unless stopped
  HeartbeatClient(const HeartbeatClient&) = delete;
  HeartbeatClient& operator=(const HeartbeatClient&) = delete;

  // Clean end: closes the stream and waits up to `grace` for the master to close its side
  // (then cancels). Idempotent.
  void stop(std::chrono::milliseconds grace);
  // Cancels the stream without closing it (what a crash looks like to the master).
  void cut();

 private:
  void write_loop();
  void read_loop();
  void join_threads();
  v1::Beat make_beat();

  const int node_rank_;
  const std::string session_id_;
  const std::shared_ptr<WorldMonitor> monitor_;
  const std::chrono::milliseconds interval_;
  const int misses_;
  const Handlers handlers_;

  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::Beat, v1::WorldStatus>> stream_;
  std::atomic<int64_t> last_reply_ns_{0};

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // stop() or cut() was called
  bool cut_ = false;   // cut(): no WritesDone
  bool read_done_ = false;
  bool writer_done_ = false;
  bool reader_done_ = false;
  std::string silence_;  // set when the master went silent
  std::thread writer_;
  std::thread reader_;
};

}  // namespace zerod
