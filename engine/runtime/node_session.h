// A node's membership in a multi-node job (DESIGN.md section 4): what the rendezvous told it
// (its node rank and global ranks), the key-value store its ranks bootstrap collectives
// through, the monitor that knows every rank's progress, and whether the world has failed.
//
// One NodeSession per zerod process. The gRPC implementation (engine/runtime/grpc/
// node_session_grpc.h: start_node_session) joins the Rendezvous service of the master and
// keeps a heartbeat stream to it; this header carries no gRPC so the engine can use it
// whether or not zerod was built with gRPC.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/peer_monitor.h"
#include "comm/store.h"

namespace zerod {

struct NodeAddress {
  int node_rank = 0;
  int first_rank = 0;
  std::string hostname;
  std::string address;  // where its ranks listen for collectives
};

// The world layout as the rendezvous decided it. Global ranks are node-major: node n runs
// ranks [n * nproc_per_node, (n + 1) * nproc_per_node).
struct NodeInfo {
  int node_rank = 0;
  int nnodes = 1;
  int nproc_per_node = 1;
  int world_size = 1;
  int first_rank = 0;
  int master_node_rank = 0;        // the node hosting the rendezvous (-1: none of the nodes)
  std::string session_id;          // unique per rendezvous; store keys live under it
  std::vector<NodeAddress> nodes;  // by node rank

  int node_of_rank(int rank) const { return rank / nproc_per_node; }
};

struct SessionOptions {
  // Hash of the resolved job: nodes whose hashes differ are refused at join.
  std::string job_hash;
  // How long to wait for the master to be reachable and for every node to join.
  std::chrono::milliseconds rendezvous_timeout{std::chrono::minutes(5)};
  // Beat period. The master declares a node silent for heartbeat_misses periods dead, and a
  // node whose master is silent that long declares the master lost.
  std::chrono::milliseconds heartbeat_interval{500};
  int heartbeat_misses = 4;
  // This node's collective address; empty: the local address facing the master.
  std::string address;
  // Empty: gethostname().
  std::string hostname;
  // Deadline of the short calls (Set, Check, Add, Leave).
  std::chrono::milliseconds rpc_timeout{std::chrono::seconds(30)};
  // The master node, leaving cleanly, keeps serving this long for the other nodes to leave.
  std::chrono::milliseconds leave_grace{std::chrono::seconds(5)};
};

class NodeSession {
 public:
  using FailureCallback = std::function<void(const std::string& reason)>;

  virtual ~NodeSession() = default;

  virtual const NodeInfo& info() const = 0;
  // The rendezvous key-value store (keys namespaced by the session id).
  virtual std::shared_ptr<Store> store() = 0;
  // Progress of every rank: this node's ranks from their communicators, the others from the
  // master's heartbeat replies.
  virtual std::shared_ptr<PeerMonitor> monitor() = 0;

  // True once a node (or the master) died or failed; failure_reason() then names it
  // ("node 1 (ranks 4-7, host b) died: heartbeat stream broke").
  virtual bool world_failed() const = 0;
  virtual std::string failure_reason() const = 0;
  // Calls fn once, from a session thread, when the world fails (at once if it already has).
  // fn must be quick and must not call leave() or destroy the session (abort the engine's
  // collectives, set a flag).
  virtual void on_world_failure(FailureCallback fn) = 0;
  // Throws Error(kPeerLost) with failure_reason() when the world has failed.
  void check_world() const;

  // Returns when every node entered barrier `name` (reusable); throws Error(kPeerLost) naming
  // the missing node ranks after timeout, or at once when the world fails.
  virtual void barrier(const std::string& name, std::chrono::milliseconds timeout) = 0;

  // Leaves the rendezvous: an empty reason is a clean exit, anything else tells the other
  // nodes that this one failed. Idempotent. The destructor leaves if this was not called:
  // cleanly, or with a failure reason when it runs while an exception unwinds the stack.
  virtual void leave(const std::string& reason) = 0;
};

}  // namespace zerod
