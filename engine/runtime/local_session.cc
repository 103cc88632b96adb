#include "engine/runtime/local_session.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>

#include "core/error.h"
#include "engine/runtime/net.h"

namespace zerod {
namespace {

class LocalSession final : public NodeSession {
 public:
  explicit LocalSession(const LaunchSpec& spec)
      : store_(std::make_shared<MemoryStore>()),
        monitor_(std::make_shared<LocalPeerMonitor>(spec.nproc_per_node)) {
    info_.node_rank = 0;
    info_.nnodes = 1;
    info_.nproc_per_node = spec.nproc_per_node;
    info_.world_size = spec.nproc_per_node;
    info_.first_rank = 0;
    info_.master_node_rank = 0;
    info_.session_id = fmt::format("local-{}-{:x}", static_cast<long>(::getpid()),
                                   std::chrono::steady_clock::now().time_since_epoch().count());
    info_.nodes.push_back({0, 0, local_hostname(), "127.0.0.1"});
  }

  const NodeInfo& info() const override { return info_; }
  std::shared_ptr<Store> store() override { return store_; }
  std::shared_ptr<PeerMonitor> monitor() override { return monitor_; }
  bool world_failed() const override { return false; }
  std::string failure_reason() const override { return ""; }
  void on_world_failure(FailureCallback) override {}
  void barrier(const std::string&, std::chrono::milliseconds) override {}
  void leave(const std::string&) override {}

 private:
  NodeInfo info_;
  std::shared_ptr<MemoryStore> store_;
  std::shared_ptr<LocalPeerMonitor> monitor_;
};

}  // namespace

std::unique_ptr<NodeSession> start_local_session(const LaunchSpec& spec) {
  ZD_CHECK_INPUT(spec.nnodes == 1,
                 "{} nodes (from {}): training on several nodes needs the gRPC rendezvous, and "
                 "this zerod was built without gRPC",
                 spec.nnodes, spec.source);
  ZD_CHECK_INPUT(spec.nproc_per_node >= 1, "--nproc-per-node {}: must be at least 1",
                 spec.nproc_per_node);
  return std::make_unique<LocalSession>(spec);
}

}  // namespace zerod
