// A node daemon's link to its master (zerod serve --node-rank R --master MASTER_CONTROL): a
// FollowJobs stream, reconnected while the daemon runs; every job the master assigns is run
// here as this node's part of it (Daemon::run_assignment).
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "engine/control/daemon.h"
#include "engine/runtime/grpc/auth.h"

namespace zerod {

class Follower {
 public:
  Follower(Daemon& daemon, std::string master_control, ClientSecurity security, int node_rank,
           int nnodes, int nproc_per_node);
  ~Follower();  // stops following (the running job, if any, goes on until the daemon ends it)
  bool connected() const { return connected_; }

 private:
  void loop();

  Daemon& daemon_;
  std::string master_;
  ClientSecurity sec_;
  int node_rank_, nnodes_, nproc_;
  std::atomic<bool> stop_{false}, connected_{false};
  std::mutex mu_;
  grpc::ClientContext* ctx_ = nullptr;  // the open stream's, for cancelling
  std::thread thread_;
};

}  // namespace zerod
