// Many WatchStatus streams from a test: opened at once over a few connections and read on one
// thread through a completion queue (so the client side costs one thread, not one per stream).
// The destructor cancels every stream and waits for each to end.
#pragma once

#ifdef ZEROD_HAVE_GRPC
#include <grpcpp/grpcpp.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "zerod.grpc.pb.h"

namespace zerod::testing {

// Threads of process `pid` (the Threads: line of /proc/PID/status), -1 when unreadable.
inline int threads_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

// CPU seconds (user + system) process `pid` has used, -1 when unreadable.
inline double cpu_seconds_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(in, stat);
  const size_t close = stat.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return -1;
  std::istringstream rest(stat.substr(close + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(field);  // utime, stime
  }
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

class Watchers {
 public:
  Watchers(const std::string& addr, int n, int connections = 8) : streams_(n) {
    for (int c = 0; c < connections; ++c) {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
      stubs_.push_back(v1::Control::NewStub(
          grpc::CreateCustomChannel(addr, grpc::InsecureChannelCredentials(), args)));
    }
    v1::WatchStatusRequest req;
    req.set_max_interval_ms(1000);
    for (int i = 0; i < n; ++i) {
      Stream& s = streams_[static_cast<size_t>(i)];
      s.reader = stubs_[static_cast<size_t>(i) % stubs_.size()]->PrepareAsyncWatchStatus(&s.ctx,
                                                                                         req, &cq_);
      s.reader->StartCall(tag(i, kStart));
    }
    thread_ = std::thread([this] { loop(); });
  }
  ~Watchers() {
    for (auto& s : streams_) s.ctx.TryCancel();
    wait_ended(static_cast<int>(streams_.size()), std::chrono::seconds(30));
    cq_.Shutdown();
    thread_.join();
  }
  Watchers(const Watchers&) = delete;
  Watchers& operator=(const Watchers&) = delete;

  int size() const { return static_cast<int>(streams_.size()); }
  int with_message() const { return with_message_; }  // streams that received a status
  int ended() const { return ended_; }
  int64_t messages() const { return messages_; }
  // Status of a stream that ended (OK while it runs).
  grpc::Status status(int i) const {
    std::lock_guard<std::mutex> lock(mu_);
    return streams_[static_cast<size_t>(i)].status;
  }
  bool has_ended(int i) const {
    std::lock_guard<std::mutex> lock(mu_);
    return streams_[static_cast<size_t>(i)].done;
  }
  void cancel(int i) { streams_[static_cast<size_t>(i)].ctx.TryCancel(); }

  bool wait_with_message(int n, std::chrono::milliseconds timeout) const {
    return wait([&] { return with_message_ >= n; }, timeout);
  }
  bool wait_ended(int n, std::chrono::milliseconds timeout) const {
    return wait([&] { return ended_ >= n; }, timeout);
  }

 private:
  enum Kind { kStart = 0, kRead = 1, kFinish = 2 };
  struct Stream {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientAsyncReader<v1::JobStatus>> reader;
    v1::JobStatus msg;
    grpc::Status status;
    int64_t got = 0;
    bool done = false;
  };
  static void* tag(int i, Kind k) {
    return reinterpret_cast<void*>(static_cast<intptr_t>(i) * 4 + k);
  }

  template <class P>
  static bool wait(P pred, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!pred()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return true;
  }

  void loop() {
    void* t = nullptr;
    bool ok = false;
    while (cq_.Next(&t, &ok)) {
      const auto v = reinterpret_cast<intptr_t>(t);
      const int i = static_cast<int>(v / 4);
      const auto kind = static_cast<Kind>(v % 4);
      Stream& s = streams_[static_cast<size_t>(i)];
      if (kind == kFinish) {
        std::lock_guard<std::mutex> lock(mu_);
        s.done = true;
        ++ended_;
        continue;
      }
      if (kind == kRead && ok) {
        if (s.got++ == 0) ++with_message_;
        ++messages_;
      }
      if (ok) {
        s.reader->Read(&s.msg, tag(i, kRead));
      } else {
        std::lock_guard<std::mutex> lock(mu_);
        s.reader->Finish(&s.status, tag(i, kFinish));
      }
    }
  }

  std::vector<std::unique_ptr<v1::Control::Stub>> stubs_;
  std::vector<Stream> streams_;
  grpc::CompletionQueue cq_;
  mutable std::mutex mu_;
  std::atomic<int> with_message_{0}, ended_{0};
  std::atomic<int64_t> messages_{0};
  std::thread thread_;
};

}  // namespace zerod::testing
#endif  // ZEROD_HAVE_GRPC
