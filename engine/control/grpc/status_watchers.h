// WatchStatus streams without a thread each: gRPC's callback API holds every stream as a reactor,
// and one thread of ours follows the daemon's status and offers each change to every stream
// (the status is built once per change, not once per stream). A stream has at most one write in
// flight: changes that arrive meanwhile are coalesced into the newest, so a slow or stalled client
// costs one pending message, not a queue.
//
// What the streams cost the training is bounded: two broadcasts are at least gap() apart, kMinGap
// (4 a second), longer when there are so many streams that they would take more than
// kMaxMessagesPerSecond messages (1,000 streams: 2 a second); changes in between are coalesced.
// Each stream gets the status again after its max_interval_ms (kMinInterval at least, and the
// gap) when nothing changed.
//
// At most `max_streams` streams are open at once (zerod serve --max-watchers); one more is
// answered RESOURCE_EXHAUSTED naming the cap and the flag.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/control/daemon.h"
#include "zerod.grpc.pb.h"

namespace zerod {

class StatusWatchers {
 public:
  static constexpr std::chrono::milliseconds kMinGap{250};       // between two broadcasts
  static constexpr int kMaxMessagesPerSecond = 2000;             // over all streams (gap())
  static constexpr std::chrono::milliseconds kMinInterval{100};  // floor of max_interval_ms
  static constexpr std::chrono::milliseconds kMaxInterval{60000};

  StatusWatchers(Daemon& daemon, int max_streams);
  ~StatusWatchers();  // shutdown()
  StatusWatchers(const StatusWatchers&) = delete;
  StatusWatchers& operator=(const StatusWatchers&) = delete;

  // The reactor of a new WatchStatus call (token already checked by the caller: `refusal` non-OK
  // finishes the call with it at once).
  grpc::ServerWriteReactor<v1::JobStatus>* open(grpc::CallbackServerContext* ctx,
                                                const v1::WatchStatusRequest* req,
                                                const grpc::Status& refusal);
  // Ends every stream (UNAVAILABLE) and the thread; later calls are refused. Idempotent.
  void shutdown();
  int open_streams() const;
  int max_streams() const { return max_; }
  // The least time between two broadcasts to `streams` streams.
  static std::chrono::milliseconds gap(size_t streams);

  class Stream;
  struct Snapshot;

 private:
  void loop();
  std::shared_ptr<const Snapshot> snapshot(uint64_t version) const;
  void remove(const Stream* s);

  Daemon& daemon_;
  const int max_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<Stream>> streams_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace zerod
