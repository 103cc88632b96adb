// The ElasticRendezvous service of proto/zerod.proto (docs/elastic.md) and its server, hosted by
// the agent of node 0 of an elastic job at --master HOST:PORT: the gRPC face of an
// ElasticRegistry (engine/runtime/elastic_registry.h), plus a Control service that answers
// GetStatus only, so that `zeroctl --addr MASTER status` shows the job's membership.
//
// Sync gRPC handlers: JoinRound waits (at most its timeout_ms) on the registry's condition
// variable; with a few agents per job, one server thread each is cheap. A timer thread ticks the
// registry (silent agents, formation deadlines) every 50 ms.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "engine/runtime/elastic_host_lease.h"
#include "engine/runtime/elastic_registry.h"

namespace grpc {
class Server;
}

namespace zerod {

struct ElasticStatusInfo {
  std::string job_name;  // the job file, for zeroctl status
  // The newest complete checkpoint's tag ("" when none): the status's last checkpoint.
  std::function<std::string()> latest_checkpoint;
  int64_t total_steps = 0;
};

// Who hosts: the lease file the server keeps fresh (elastic_host_lease.h), and for a node taking
// the rendezvous over from a lost host, what it knew.
struct ElasticHosting {
  std::string lease_path;  // "" none (unit tests)
  int64_t term = 1;
  int node_rank = -1;
  std::string instance;
  std::optional<ElasticTakeover> takeover;
};

class ElasticServer {
 public:
  // Binds host:port (InputError naming the address when taken or not local) and serves.
  ElasticServer(const std::string& host, int port, ElasticConfig config, ElasticStatusInfo info,
                ElasticHosting hosting = {});
  ~ElasticServer();
  ElasticServer(const ElasticServer&) = delete;
  ElasticServer& operator=(const ElasticServer&) = delete;

  ElasticRegistry& registry() { return *registry_; }
  const std::string& address() const { return address_; }
  int64_t term() const { return hosting_.term; }
  // Ends the timer and the server (waiting calls end). Idempotent.
  void stop();

 private:
  struct Services;
  std::string address_;
  ElasticHosting hosting_;
  std::unique_ptr<ElasticHostLease> lease_;
  std::unique_ptr<ElasticRegistry> registry_;
  std::unique_ptr<Services> services_;
  std::unique_ptr<grpc::Server> server_;
  std::atomic<bool> stopping_{false};
  std::thread timer_;
};

}  // namespace zerod
