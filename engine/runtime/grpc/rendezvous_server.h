// The Rendezvous service hosted in-process by the master node's zerod: binds exactly
// --master's HOST:PORT (never SO_REUSEPORT, so a second zerod cannot share the port), runs the
// service's deadlines on a timer thread, and stops cleanly (waiting calls end with
// UNAVAILABLE, heartbeat streams close).
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

#include "engine/runtime/grpc/rendezvous_service.h"

namespace zerod {

struct RendezvousServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  // Resolution of deadlines and silence detection.
  std::chrono::milliseconds tick{25};
  // Extra builder settings. (Tokens on the Rendezvous service come with multi-node daemons.)
  std::function<void(grpc::ServerBuilder&)> configure_builder;
};

class RendezvousServer {
 public:
  // Binds host:port and serves. Throws InputError naming the address when it is already in
  // use ("127.0.0.1:29500 is already in use") or is not an address of this machine.
  static std::unique_ptr<RendezvousServer> start(const RendezvousServerOptions& options);
  // Like start(), but returns nullptr when the port is taken or the host is not local (a node
  // that lets the master assign its rank hosts only if it gets there first).
  static std::unique_ptr<RendezvousServer> try_start(const RendezvousServerOptions& options);

  ~RendezvousServer();
  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;

  // Ends every call and stream, then shuts the server down. Idempotent.
  void stop();

  const std::string& address() const { return address_; }
  const std::string& session_id() const { return service_->session_id(); }
  RendezvousService& service() { return *service_; }

  // Waits until every node has left or died (true), or timeout or stop() (false).
  bool wait_all_nodes_done(std::chrono::milliseconds timeout);

 private:
  RendezvousServer() = default;
  static std::unique_ptr<RendezvousServer> start_impl(const RendezvousServerOptions& options,
                                                      bool may_fail);
  void timer_loop(std::chrono::milliseconds tick);

  std::string address_;
  std::unique_ptr<RendezvousService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::thread timer_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
};

}  // namespace zerod
