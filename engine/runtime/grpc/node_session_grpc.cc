#include "engine/runtime/grpc/node_session_grpc.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <exception>
#include <mutex>

#include "core/error.h"
#include "core/timer.h"
#include "engine/runtime/grpc/channel.h"
#include "engine/runtime/grpc/grpc_store.h"
#include "engine/runtime/grpc/heartbeat_client.h"
#include "engine/runtime/grpc/rendezvous_server.h"
#include "engine/runtime/net.h"
#include "engine/runtime/world_monitor.h"

namespace zerod {
namespace {

using std::chrono::milliseconds;

// A waiting call's answer comes at the server's deadline; give it this long to arrive.
constexpr milliseconds kReplyMargin{5000};
// Leave and the stream's closing should be quick; never wait long for a gone master.
constexpr milliseconds kLeaveTimeout{3000};
constexpr milliseconds kCloseGrace{2000};

std::string rank_range(int first, int count) {
  if (count == 1) return fmt::format("rank {}", first);
  return fmt::format("ranks {}-{}", first, first + count - 1);
}

class GrpcNodeSession final : public NodeSession {
 public:
  GrpcNodeSession(const LaunchSpec& spec, const SessionOptions& options);
  ~GrpcNodeSession() override;

  const NodeInfo& info() const override { return info_; }
  std::shared_ptr<Store> store() override { return store_; }
  std::shared_ptr<PeerMonitor> monitor() override { return monitor_; }
  bool world_failed() const override;
  std::string failure_reason() const override;
  void on_world_failure(FailureCallback fn) override;
  void barrier(const std::string& name, milliseconds timeout) override;
  void leave(const std::string& reason) override;

  void cut_heartbeat();
  RendezvousServer* server() { return server_.get(); }

 private:
  void join(Clock::time_point deadline);
  void on_status(const v1::WorldStatus& status);
  void on_lost(const std::string& why);
  void set_failure(const std::string& reason);

  const LaunchSpec spec_;
  const SessionOptions options_;
  const std::string master_;
  const int uncaught_at_start_ = std::uncaught_exceptions();

  std::unique_ptr<RendezvousServer> server_;  // when this node hosts the rendezvous
  std::shared_ptr<grpc::Channel> channel_;
  std::shared_ptr<v1::Rendezvous::Stub> stub_;
  NodeInfo info_;
  std::shared_ptr<WorldMonitor> monitor_;
  std::shared_ptr<GrpcStore> store_;
  std::unique_ptr<HeartbeatClient> heartbeat_;

  mutable std::mutex mu_;
  bool failed_ = false;
  std::string failure_;
  std::vector<FailureCallback> callbacks_;
  bool left_ = false;
};

GrpcNodeSession::GrpcNodeSession(const LaunchSpec& spec, const SessionOptions& options)
    : spec_(spec), options_(options), master_(spec.master_address()) {
  ZD_CHECK_INPUT(spec.nnodes >= 1 && spec.nproc_per_node >= 1 && spec.node_rank >= -1 &&
                     spec.node_rank < spec.nnodes,
                 "bad launch: node rank {} of {} nodes, {} ranks per node", spec.node_rank,
                 spec.nnodes, spec.nproc_per_node);
  const Stopwatch watch;
  const auto deadline = Clock::now() + options.rendezvous_timeout;
  // Where our collectives listen: the interface that faces the master (resolves it, too).
  std::string address = options.address;
  if (address.empty()) address = local_address_towards(spec.master_host, spec.master_port);

  RendezvousServerOptions server_options;
  server_options.host = spec.master_host;
  server_options.port = spec.master_port;
  if (spec.node_rank == 0)
    server_ = RendezvousServer::start(server_options);
  else if (spec.node_rank == -1)
    server_ = RendezvousServer::try_start(server_options);

  channel_ = make_rendezvous_channel(master_);
  stub_ = v1::Rendezvous::NewStub(channel_);
  if (!wait_connected(*channel_, options.rendezvous_timeout))
    ZD_THROW_KIND(ErrorKind::kPeerLost,
                  "cannot reach the rendezvous master at {}: tried for {:.1f} s (is node 0 "
                  "running there? check --master or MASTER_ADDR/MASTER_PORT)",
                  master_, watch.seconds());
  info_.nodes.clear();
  {
    v1::JoinRequest req;
    req.set_job_hash(options.job_hash);
    req.set_nnodes(spec.nnodes);
    req.set_node_rank(spec.node_rank);
    req.set_nproc_per_node(spec.nproc_per_node);
    req.set_hostname(options.hostname.empty() ? local_hostname() : options.hostname);
    req.set_address(address);
    req.set_timeout_ms(std::max<int64_t>(
        1, std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count()));
    req.set_heartbeat_timeout_ms(options.heartbeat_interval.count() *
                                 std::max(1, options.heartbeat_misses));
    req.set_hosts_rendezvous(server_ != nullptr);
    v1::JoinResponse resp;
    grpc::ClientContext ctx;
    prepare_context(ctx, milliseconds(req.timeout_ms()) + kReplyMargin);
    const grpc::Status st = stub_->Join(&ctx, req, &resp);
    if (!st.ok()) throw_status(st, "join", master_);
    info_.node_rank = resp.node_rank();
    info_.nnodes = resp.nnodes();
    info_.nproc_per_node = resp.nproc_per_node();
    info_.world_size = resp.world_size();
    info_.first_rank = resp.first_rank();
    info_.master_node_rank = resp.master_node_rank();
    info_.session_id = resp.session_id();
    for (const auto& n : resp.nodes())
      info_.nodes.push_back({n.node_rank(), n.first_rank(), n.hostname(), n.address()});
  }
  ZD_CHECK(info_.world_size == info_.nnodes * info_.nproc_per_node &&
               info_.first_rank == info_.node_rank * info_.nproc_per_node,
           "inconsistent join answer: node {} first rank {} of {} ({} x {})", info_.node_rank,
           info_.first_rank, info_.world_size, info_.nnodes, info_.nproc_per_node);

  monitor_ =
      std::make_shared<WorldMonitor>(info_.world_size, info_.first_rank, info_.nproc_per_node);
  store_ = std::make_shared<GrpcStore>(stub_, info_.session_id + "/", master_, options.rpc_timeout);
  HeartbeatClient::Handlers handlers;
  handlers.on_status = [this](const v1::WorldStatus& s) { on_status(s); };
  handlers.on_lost = [this](const std::string& why) { on_lost(why); };
  heartbeat_ = std::make_unique<HeartbeatClient>(*stub_, info_.node_rank, info_.session_id,
                                                 monitor_, options.heartbeat_interval,
                                                 options.heartbeat_misses, std::move(handlers));
  spdlog::info("rendezvous: node {} of {} joined at {} in {:.2f} s ({} of world size {}{})",
               info_.node_rank, info_.nnodes, master_, watch.seconds(),
               rank_range(info_.first_rank, info_.nproc_per_node), info_.world_size,
               server_ ? ", hosting the rendezvous" : "");
}

GrpcNodeSession::~GrpcNodeSession() {
  try {
    bool left;
    {
      std::lock_guard<std::mutex> lock(mu_);
      left = left_;
    }
    if (!left)
      leave(std::uncaught_exceptions() > uncaught_at_start_ ? "the node exited with an error" : "");
  } catch (const std::exception& e) {
    spdlog::warn("rendezvous: leaving failed: {}", e.what());
  }
  heartbeat_.reset();
  if (server_) server_->stop();
}

bool GrpcNodeSession::world_failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_;
}

std::string GrpcNodeSession::failure_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

void GrpcNodeSession::on_world_failure(FailureCallback fn) {
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_) {
      callbacks_.push_back(std::move(fn));
      return;
    }
    reason = failure_;
  }
  fn(reason);
}

void GrpcNodeSession::set_failure(const std::string& reason) {
  std::vector<FailureCallback> callbacks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_) return;
    failed_ = true;
    failure_ = reason;
    callbacks = callbacks_;
    if (left_) return;  // this node is already on its way out: nothing to report
  }
  spdlog::error("rendezvous: the job failed: {}", reason);
  for (auto& fn : callbacks) fn(reason);
}

void GrpcNodeSession::on_status(const v1::WorldStatus& status) {
  for (const auto& p : status.ranks()) {
    RankProgress r;
    r.started = p.started();
    r.completed = p.completed();
    r.alive = p.alive();
    r.reason = p.reason();
    monitor_->update_remote(p.rank(), r);
  }
  if (status.failed()) set_failure(status.failure());
}

void GrpcNodeSession::on_lost(const std::string& why) {
  const int m = info_.master_node_rank;
  if (m >= 0 && m != info_.node_rank)
    monitor_->mark_remote_dead(m * info_.nproc_per_node, info_.nproc_per_node,
                               "master unreachable");
  const std::string who =
      m >= 0 ? fmt::format(" (node {}, {})", m,
                           rank_range(m * info_.nproc_per_node, info_.nproc_per_node))
             : "";
  set_failure(fmt::format("lost the rendezvous master at {}{}: {}", master_, who, why));
}

void GrpcNodeSession::barrier(const std::string& name, milliseconds timeout) {
  v1::BarrierRequest req;
  req.set_name(name);
  req.set_node_rank(info_.node_rank);
  req.set_session_id(info_.session_id);
  req.set_timeout_ms(timeout.count());
  v1::BarrierResponse resp;
  grpc::ClientContext ctx;
  prepare_context(ctx, timeout + kReplyMargin);
  const grpc::Status st = stub_->Barrier(&ctx, req, &resp);
  if (!st.ok()) throw_status(st, fmt::format("barrier '{}'", name), master_);
}

void GrpcNodeSession::leave(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (left_) return;
    left_ = true;
  }
  v1::LeaveRequest req;
  req.set_node_rank(info_.node_rank);
  req.set_session_id(info_.session_id);
  req.set_reason(reason);
  v1::LeaveResponse resp;
  grpc::ClientContext ctx;
  prepare_context(ctx, std::min(options_.rpc_timeout, kLeaveTimeout));
  const grpc::Status st = stub_->Leave(&ctx, req, &resp);
  if (!st.ok()) spdlog::debug("rendezvous: leave: {}", describe_status(st));
  if (server_) {
    // Keep serving while the other nodes finish (or, on failure, learn of it).
    const milliseconds grace =
        reason.empty() ? options_.leave_grace : std::min(options_.leave_grace, kCloseGrace);
    if (!server_->wait_all_nodes_done(grace) && reason.empty())
      spdlog::warn("rendezvous: stopping the server at {} before every node left", master_);
  }
  heartbeat_->stop(kCloseGrace);
  if (server_) server_->stop();
}

void GrpcNodeSession::cut_heartbeat() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    left_ = true;
  }
  heartbeat_->cut();
}

}  // namespace

std::unique_ptr<NodeSession> start_node_session(const LaunchSpec& spec,
                                                const SessionOptions& options) {
  return std::make_unique<GrpcNodeSession>(spec, options);
}

void cut_heartbeat_for_testing(NodeSession& session) {
  auto* s = dynamic_cast<GrpcNodeSession*>(&session);
  ZD_CHECK(s != nullptr, "cut_heartbeat_for_testing needs a session from start_node_session");
  s->cut_heartbeat();
}

RendezvousServer* hosted_server(NodeSession& session) {
  auto* s = dynamic_cast<GrpcNodeSession*>(&session);
  return s ? s->server() : nullptr;
}

}  // namespace zerod
