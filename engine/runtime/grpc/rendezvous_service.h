// The Rendezvous service of proto/zerod.proto: the node registry (join, heartbeats, leave),
// the key-value store and barriers of one job, held in memory by the master zerod.
//
// Calls that wait (Join, Get, Wait, Barrier) use the gRPC callback API: their handler only
// records them, and the event that satisfies them (the last Join, a Set, the last node at a
// barrier) or the service's tick() at their deadline finishes them. No gRPC thread ever blocks,
// so any number of nodes can wait at once. Reactors are always finished outside the lock.
//
// The world fails (failed() turns true, for good) when a node dies, goes silent, leaves with
// a failure, or -- while nodes are still gathering -- when a join is refused or times out.
// Then every waiting call ends at once (ABORTED with the reason, or for joins the refusal's
// own code) and every heartbeat stream receives the new status.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "core/timer.h"
#include "zerod.grpc.pb.h"

namespace zerod {

class HeartbeatStream;

class RendezvousService final : public v1::Rendezvous::CallbackService {
 public:
  // `address` appears in messages; `session_id` identifies this rendezvous.
  RendezvousService(std::string address, std::string session_id);
  ~RendezvousService() override;

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* ctx, const v1::JoinRequest* req,
                                 v1::JoinResponse* resp) override;
  grpc::ServerBidiReactor<v1::Beat, v1::WorldStatus>* Heartbeat(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* ctx, const v1::LeaveRequest* req,
                                  v1::LeaveResponse* resp) override;
  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* ctx, const v1::SetRequest* req,
                                v1::SetResponse* resp) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* ctx, const v1::GetRequest* req,
                                v1::GetResponse* resp) override;
  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* ctx, const v1::CheckRequest* req,
                                  v1::CheckResponse* resp) override;
  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* ctx, const v1::WaitRequest* req,
                                 v1::WaitResponse* resp) override;
  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext* ctx, const v1::AddRequest* req,
                                v1::AddResponse* resp) override;
  grpc::ServerUnaryReactor* Barrier(grpc::CallbackServerContext* ctx, const v1::BarrierRequest* req,
                                    v1::BarrierResponse* resp) override;

  // Deadlines, callers that went away, silent nodes. The server calls it every few tens of ms.
  void tick();
  // Ends every waiting call and stream with UNAVAILABLE and refuses new calls.
  void shutdown();

  const std::string& session_id() const { return session_id_; }
  bool formed() const;
  bool failed() const;
  std::string failure() const;
  // Every node's state (empty before the world formed).
  std::vector<v1::NodeStatus> node_states() const;
  // True once the world formed and every node has left or died.
  bool all_nodes_done() const;

  // For HeartbeatStream. on_beat fills `reply` or returns the error to end the stream with.
  grpc::Status on_beat(HeartbeatStream* stream, const v1::Beat& beat, v1::WorldStatus* reply);
  void on_stream_end(HeartbeatStream* stream);
  void on_stream_done(HeartbeatStream* stream);

 private:
  // A call waiting for an event or its deadline.
  struct Pending {
    grpc::CallbackServerContext* ctx = nullptr;
    grpc::ServerUnaryReactor* reactor = nullptr;
    Clock::time_point started;
    Clock::time_point deadline;
  };
  struct Joiner {
    Pending call;
    v1::JoinRequest req;
    v1::JoinResponse* resp = nullptr;
  };
  struct Node {
    v1::NodeEntry entry;
    v1::NodeState state = v1::NODE_STATE_RUNNING;
    std::string reason;
    Clock::time_point last_beat;
    std::chrono::milliseconds silence_timeout{0};
    HeartbeatStream* stream = nullptr;  // identity only
  };
  struct GetCall {
    Pending call;
    std::string key;
    v1::GetResponse* resp = nullptr;
  };
  struct WaitCall {
    Pending call;
    std::vector<std::string> keys;
    v1::WaitResponse* resp = nullptr;
  };
  struct BarrierCall {
    Pending call;
    std::string name;
    int64_t generation = 0;
  };
  struct BarrierState {
    int64_t generation = 0;
    std::set<int> arrived;
  };
  // Side effects of a state change, carried out after the lock is released.
  struct Effects {
    std::vector<std::pair<grpc::ServerUnaryReactor*, grpc::Status>> finishes;
    bool broadcast = false;
  };

  void apply(Effects& fx);
  Pending make_pending(grpc::CallbackServerContext* ctx, grpc::ServerUnaryReactor* r,
                       int64_t timeout_ms) const;
  grpc::Status unavailable() const;
  // A unary call's reactor; finished UNAUTHENTICATED, with *denied set, when the call lacks
  // the process token (auth.h). Every unary handler starts with it.
  static grpc::ServerUnaryReactor* start_unary(grpc::CallbackServerContext* ctx, bool* denied);

  // Registry (rendezvous_service.cc).
  grpc::Status refuse_join(const v1::JoinRequest& req, Effects& fx);
  void form_world(Effects& fx);
  void fail_world(grpc::StatusCode code, const std::string& message, Effects& fx);
  void node_died(Node& node, const std::string& what, Effects& fx);
  void tick_joins(Clock::time_point now, Effects& fx);
  std::string describe_node(const Node& node) const;
  std::string describe_joiner(const v1::JoinRequest& req) const;
  std::string missing_nodes_message() const;
  v1::WorldStatus build_status() const;

  // Store and barriers (rendezvous_store.cc).
  void key_changed(const std::string& key, Effects& fx);
  void abort_waiters(const std::string& message, Effects& fx);
  void tick_store(Clock::time_point now, Effects& fx);
  std::string barrier_missing(const BarrierState& b) const;

  const std::string address_;
  const std::string session_id_;

  mutable std::mutex mu_;
  bool stopping_ = false;
  // Gathering: the nodes whose Join waits, in arrival order, and the first joiner's values.
  std::vector<Joiner> joiners_;
  bool have_reference_ = false;
  v1::JoinRequest reference_;
  // Formed.
  bool formed_ = false;
  int nnodes_ = 0;
  int nproc_ = 0;
  int master_node_rank_ = -1;
  std::vector<Node> nodes_;              // by node rank
  std::vector<v1::RankProgress> ranks_;  // by global rank
  std::set<HeartbeatStream*> streams_;   // open streams (for broadcasts)
  // Failure (final).
  bool failed_ = false;
  grpc::StatusCode failure_code_ = grpc::StatusCode::OK;
  std::string failure_;
  // Store.
  std::map<std::string, std::string> kv_;
  std::vector<GetCall> gets_;
  std::vector<WaitCall> waits_;
  std::map<std::string, BarrierState> barriers_;
  std::vector<BarrierCall> barrier_calls_;
};

}  // namespace zerod
