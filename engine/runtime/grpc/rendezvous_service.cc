// The node registry: Join, Heartbeat, Leave, failure, and the world's status.
#include "engine/runtime/grpc/rendezvous_service.h"
#include "engine/runtime/grpc/auth.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>

#include "engine/runtime/grpc/channel.h"
#include "engine/runtime/grpc/heartbeat_stream.h"

namespace zerod {
namespace {

constexpr int64_t kMaxTimeoutMs = int64_t{24} * 3600 * 1000;
constexpr std::chrono::milliseconds kMinSilence{200};

std::string rank_range(int first, int count) {
  if (count == 1) return fmt::format("rank {}", first);
  return fmt::format("ranks {}-{}", first, first + count - 1);
}

}  // namespace

RendezvousService::RendezvousService(std::string address, std::string session_id)
    : address_(std::move(address)), session_id_(std::move(session_id)) {}

RendezvousService::~RendezvousService() = default;

RendezvousService::Pending RendezvousService::make_pending(grpc::CallbackServerContext* ctx,
                                                           grpc::ServerUnaryReactor* r,
                                                           int64_t timeout_ms) const {
  Pending p;
  p.ctx = ctx;
  p.reactor = r;
  p.started = Clock::now();
  p.deadline =
      p.started + std::chrono::milliseconds(std::clamp<int64_t>(timeout_ms, 0, kMaxTimeoutMs));
  return p;
}

grpc::Status RendezvousService::unavailable() const {
  return {grpc::StatusCode::UNAVAILABLE,
          fmt::format("the rendezvous server at {} is shutting down", address_)};
}

void RendezvousService::apply(Effects& fx) {
  for (auto& [reactor, status] : fx.finishes) reactor->Finish(status);
  fx.finishes.clear();
  if (!fx.broadcast) return;
  v1::WorldStatus status;
  std::vector<HeartbeatStream*> targets;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!formed_) return;
    status = build_status();
    for (HeartbeatStream* s : streams_) {
      if (s->node_rank < 0) continue;
      s->ref();
      targets.push_back(s);
    }
  }
  for (HeartbeatStream* s : targets) {
    s->push(status);
    s->unref();
  }
}

std::string RendezvousService::describe_joiner(const v1::JoinRequest& req) const {
  std::string who = fmt::format("host {} ({})", req.hostname().empty() ? "?" : req.hostname(),
                                req.address().empty() ? "no address" : req.address());
  if (req.node_rank() >= 0) return fmt::format("node {} on {}", req.node_rank(), who);
  return fmt::format("the node on {}", who);
}

std::string RendezvousService::describe_node(const Node& node) const {
  const int rank = node.entry.node_rank();
  return fmt::format("node {} ({}, host {})", rank, rank_range(rank * nproc_, nproc_),
                     node.entry.hostname().empty() ? "?" : node.entry.hostname());
}

// --- Join ------------------------------------------------------------------------------------

grpc::Status RendezvousService::refuse_join(const v1::JoinRequest& req, Effects& fx) {
  using grpc::StatusCode;
  const std::string who = describe_joiner(req);
  if (req.nnodes() < 1 || req.nproc_per_node() < 1 || req.node_rank() < -1 ||
      req.node_rank() >= req.nnodes() || req.timeout_ms() <= 0)
    return {
        StatusCode::INVALID_ARGUMENT,
        fmt::format("{} sent a malformed join: nnodes {}, node rank {}, nproc per node {}, "
                    "timeout {} ms",
                    who, req.nnodes(), req.node_rank(), req.nproc_per_node(), req.timeout_ms())};
  if (formed_)
    return {StatusCode::FAILED_PRECONDITION,
            fmt::format("{} came too late: the rendezvous already completed with {} nodes "
                        "(session {}); restart every node of the job",
                        who, nnodes_, session_id_)};
  if (failed_) return {failure_code_, failure_};

  std::string why;
  if (have_reference_) {
    const std::string first = describe_joiner(reference_);
    if (req.job_hash() != reference_.job_hash())
      why = fmt::format(
          "{} has job hash {} but {} (the first to join) has {}: the nodes were started with "
          "different job files or flags",
          who, req.job_hash(), first, reference_.job_hash());
    else if (req.nnodes() != reference_.nnodes())
      why = fmt::format("{} expects {} nodes (--nnodes) but {} (the first to join) expects {}", who,
                        req.nnodes(), first, reference_.nnodes());
    else if (req.nproc_per_node() != reference_.nproc_per_node())
      why = fmt::format(
          "{} runs {} ranks per node (--nproc-per-node) but {} (the first to join) runs {}", who,
          req.nproc_per_node(), first, reference_.nproc_per_node());
  }
  if (why.empty() && req.node_rank() >= 0) {
    for (const Joiner& j : joiners_)
      if (j.req.node_rank() == req.node_rank())
        why = fmt::format("node rank {} was claimed twice: by {} and by {}", req.node_rank(),
                          describe_joiner(j.req), who);
  }
  if (why.empty()) return grpc::Status::OK;
  // The job cannot form: tell every waiting node now rather than at its deadline.
  const std::string message = fmt::format("rendezvous refused a node: {}", why);
  fail_world(StatusCode::FAILED_PRECONDITION, message, fx);
  return {StatusCode::FAILED_PRECONDITION, message};
}

grpc::ServerUnaryReactor* RendezvousService::start_unary(grpc::CallbackServerContext* ctx,
                                                         bool* denied) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  grpc::Status st = check_token(*ctx, process_token());
  *denied = !st.ok();
  if (*denied) reactor->Finish(std::move(st));
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousService::Join(grpc::CallbackServerContext* ctx,
                                                  const v1::JoinRequest* req,
                                                  v1::JoinResponse* resp) {
  bool denied = false;
  grpc::ServerUnaryReactor* reactor = start_unary(ctx, &denied);
  if (denied) return reactor;
  Effects fx;
  {
    std::lock_guard<std::mutex> lock(mu_);
    grpc::Status refused = stopping_ ? unavailable() : refuse_join(*req, fx);
    if (!refused.ok()) {
      fx.finishes.emplace_back(reactor, std::move(refused));
    } else {
      if (!have_reference_) {
        have_reference_ = true;
        reference_ = *req;
      }
      joiners_.push_back({make_pending(ctx, reactor, req->timeout_ms()), *req, resp});
      if (static_cast<int>(joiners_.size()) == req->nnodes()) form_world(fx);
    }
  }
  apply(fx);
  return reactor;
}

void RendezvousService::form_world(Effects& fx) {
  nnodes_ = reference_.nnodes();
  nproc_ = reference_.nproc_per_node();
  // Explicit node ranks first, then the others in the order they joined, lowest free first.
  std::vector<int> assigned(joiners_.size(), -1);
  std::vector<bool> taken(static_cast<size_t>(nnodes_), false);
  for (size_t i = 0; i < joiners_.size(); ++i) {
    const int r = joiners_[i].req.node_rank();
    if (r >= 0) {
      assigned[i] = r;
      taken[static_cast<size_t>(r)] = true;
    }
  }
  int next_free = 0;
  for (size_t i = 0; i < joiners_.size(); ++i) {
    if (assigned[i] >= 0) continue;
    while (taken[static_cast<size_t>(next_free)]) ++next_free;
    assigned[i] = next_free;
    taken[static_cast<size_t>(next_free)] = true;
  }
  const auto now = Clock::now();
  nodes_.assign(static_cast<size_t>(nnodes_), Node{});
  for (size_t i = 0; i < joiners_.size(); ++i) {
    const v1::JoinRequest& req = joiners_[i].req;
    Node& node = nodes_[static_cast<size_t>(assigned[i])];
    node.entry.set_node_rank(assigned[i]);
    node.entry.set_first_rank(assigned[i] * nproc_);
    node.entry.set_hostname(req.hostname());
    node.entry.set_address(req.address());
    node.last_beat = now;
    node.silence_timeout =
        std::max(kMinSilence,
                 std::chrono::milliseconds(std::min(req.heartbeat_timeout_ms(), kMaxTimeoutMs)));
    if (req.hosts_rendezvous()) master_node_rank_ = assigned[i];
  }
  ranks_.assign(static_cast<size_t>(nnodes_ * nproc_), v1::RankProgress{});
  for (int r = 0; r < nnodes_ * nproc_; ++r) {
    ranks_[static_cast<size_t>(r)].set_rank(r);
    ranks_[static_cast<size_t>(r)].set_alive(true);
  }
  for (size_t i = 0; i < joiners_.size(); ++i) {
    v1::JoinResponse* resp = joiners_[i].resp;
    resp->set_node_rank(assigned[i]);
    resp->set_nnodes(nnodes_);
    resp->set_nproc_per_node(nproc_);
    resp->set_world_size(nnodes_ * nproc_);
    resp->set_first_rank(assigned[i] * nproc_);
    resp->set_session_id(session_id_);
    resp->set_master_node_rank(master_node_rank_);
    for (const Node& n : nodes_) *resp->add_nodes() = n.entry;
    fx.finishes.emplace_back(joiners_[i].call.reactor, grpc::Status::OK);
  }
  joiners_.clear();
  formed_ = true;
}

std::string RendezvousService::missing_nodes_message() const {
  const int n = reference_.nnodes();
  std::vector<bool> claimed(static_cast<size_t>(n), false);
  std::vector<std::string> joined;
  int unassigned = 0;
  for (const Joiner& j : joiners_) {
    joined.push_back(describe_joiner(j.req));
    if (j.req.node_rank() >= 0)
      claimed[static_cast<size_t>(j.req.node_rank())] = true;
    else
      ++unassigned;
  }
  std::vector<int> free;
  for (int r = 0; r < n; ++r)
    if (!claimed[static_cast<size_t>(r)]) free.push_back(r);
  const int missing = n - static_cast<int>(joiners_.size());
  std::string msg =
      fmt::format("{} of {} nodes joined ({}); ", joiners_.size(), n, fmt::join(joined, "; "));
  if (unassigned == 0)
    msg += fmt::format("missing node rank{} {}", missing == 1 ? "" : "s", fmt::join(free, ", "));
  else
    msg += fmt::format("{} node{} missing (node ranks not claimed yet: {})", missing,
                       missing == 1 ? "" : "s", fmt::join(free, ", "));
  return msg;
}

void RendezvousService::tick_joins(Clock::time_point now, Effects& fx) {
  if (formed_ || failed_) return;
  for (auto it = joiners_.begin(); it != joiners_.end();) {
    if (it->call.ctx->IsCancelled()) {  // the node went away before the world formed
      fx.finishes.emplace_back(it->call.reactor,
                               grpc::Status(grpc::StatusCode::CANCELLED, "join cancelled"));
      it = joiners_.erase(it);
    } else {
      ++it;
    }
  }
  if (joiners_.empty()) have_reference_ = false;
  for (const Joiner& j : joiners_) {
    if (now < j.call.deadline) continue;
    const double waited = std::chrono::duration<double>(now - j.call.started).count();
    fail_world(grpc::StatusCode::DEADLINE_EXCEEDED,
               fmt::format("rendezvous at {} timed out after {:.1f} s: {}", address_, waited,
                           missing_nodes_message()),
               fx);
    return;
  }
}

// --- Failure ---------------------------------------------------------------------------------

void RendezvousService::fail_world(grpc::StatusCode code, const std::string& message, Effects& fx) {
  if (failed_) return;
  failed_ = true;
  failure_code_ = code;
  failure_ = message;
  for (Joiner& j : joiners_) fx.finishes.emplace_back(j.call.reactor, grpc::Status(code, message));
  joiners_.clear();
  abort_waiters(message, fx);
  fx.broadcast = true;
}

void RendezvousService::node_died(Node& node, const std::string& what, Effects& fx) {
  if (node.state != v1::NODE_STATE_RUNNING) return;
  node.state = v1::NODE_STATE_DEAD;
  node.reason = what;
  const int first = node.entry.first_rank();
  for (int r = first; r < first + nproc_; ++r) {
    auto& rank = ranks_[static_cast<size_t>(r)];
    if (!rank.alive()) continue;
    rank.set_alive(false);
    rank.set_reason(fmt::format("node {} {}", node.entry.node_rank(), what));
  }
  fail_world(grpc::StatusCode::ABORTED, fmt::format("{} {}", describe_node(node), what), fx);
  fx.broadcast = true;
}

// --- Heartbeat -------------------------------------------------------------------------------

grpc::ServerBidiReactor<v1::Beat, v1::WorldStatus>* RendezvousService::Heartbeat(
    grpc::CallbackServerContext* ctx) {
  auto* stream = new HeartbeatStream(this);
  const grpc::Status denied = check_token(*ctx, process_token());
  // The node this stream beats for, from the call's metadata (beats confirm it).
  int node_rank = -1;
  std::string session;
  for (const auto& [key, value] : ctx->client_metadata()) {
    if (key == kNodeRankMetadata)
      node_rank = std::atoi(std::string(value.data(), value.size()).c_str());
    if (key == kSessionMetadata) session.assign(value.data(), value.size());
  }
  bool stopping = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping = stopping_;
    streams_.insert(stream);
    if (denied.ok() && formed_ && session == session_id_ && node_rank >= 0 && node_rank < nnodes_) {
      Node& node = nodes_[static_cast<size_t>(node_rank)];
      if (node.state == v1::NODE_STATE_RUNNING && node.stream == nullptr) {
        stream->node_rank = node_rank;
        node.stream = stream;
      }
    }
  }
  if (!denied.ok()) {
    stream->finish(denied);
  } else if (stopping) {
    stream->finish(unavailable());
  }
  return stream;
}

grpc::Status RendezvousService::on_beat(HeartbeatStream* stream, const v1::Beat& beat,
                                        v1::WorldStatus* reply) {
  using grpc::StatusCode;
  Effects fx;
  grpc::Status result;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return unavailable();
    if (!formed_)
      return {StatusCode::FAILED_PRECONDITION, "heartbeat before the rendezvous completed"};
    if (beat.session_id() != session_id_)
      return {StatusCode::FAILED_PRECONDITION,
              fmt::format("heartbeat for session {} but this rendezvous is session {}",
                          beat.session_id(), session_id_)};
    if (beat.node_rank() < 0 || beat.node_rank() >= nnodes_ ||
        (stream->node_rank >= 0 && stream->node_rank != beat.node_rank()))
      return {StatusCode::INVALID_ARGUMENT,
              fmt::format("heartbeat from node rank {} (world of {} nodes)", beat.node_rank(),
                          nnodes_)};
    Node& node = nodes_[static_cast<size_t>(beat.node_rank())];
    if (node.state != v1::NODE_STATE_RUNNING)
      return {StatusCode::FAILED_PRECONDITION,
              fmt::format("node {} already {}", beat.node_rank(),
                          node.state == v1::NODE_STATE_LEFT ? "left" : node.reason)};
    stream->node_rank = beat.node_rank();
    node.stream = stream;
    node.last_beat = Clock::now();
    const int first = node.entry.first_rank();
    for (const v1::RankProgress& p : beat.ranks()) {
      if (p.rank() < first || p.rank() >= first + nproc_) continue;  // not this node's
      auto& rank = ranks_[static_cast<size_t>(p.rank())];
      rank.set_started(std::max(rank.started(), p.started()));
      rank.set_completed(std::max(rank.completed(), p.completed()));
      if (!p.alive() && rank.alive()) {
        rank.set_alive(false);
        rank.set_reason(p.reason());
        fail_world(StatusCode::ABORTED,
                   fmt::format("rank {} on {} failed: {}", p.rank(), describe_node(node),
                               p.reason().empty() ? "no reason given" : p.reason()),
                   fx);
      }
    }
    *reply = build_status();
  }
  apply(fx);
  return result;
}

void RendezvousService::on_stream_end(HeartbeatStream* stream) {
  Effects fx;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || !formed_ || stream->node_rank < 0) return;
    Node& node = nodes_[static_cast<size_t>(stream->node_rank)];
    if (node.stream != stream) return;
    node.stream = nullptr;
    node_died(node,
              "died: its heartbeat stream broke without a Leave (the process was killed or lost "
              "its connection)",
              fx);
  }
  apply(fx);
}

void RendezvousService::on_stream_done(HeartbeatStream* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  streams_.erase(stream);
  for (Node& n : nodes_)
    if (n.stream == stream) n.stream = nullptr;
}

// --- Leave -----------------------------------------------------------------------------------

grpc::ServerUnaryReactor* RendezvousService::Leave(grpc::CallbackServerContext* ctx,
                                                   const v1::LeaveRequest* req,
                                                   v1::LeaveResponse*) {
  bool denied = false;
  grpc::ServerUnaryReactor* reactor = start_unary(ctx, &denied);
  if (denied) return reactor;
  Effects fx;
  grpc::Status status;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      status = unavailable();
    } else if (!formed_ || req->session_id() != session_id_) {
      status = {grpc::StatusCode::FAILED_PRECONDITION,
                fmt::format("leave for session '{}' but this rendezvous is session {}{}",
                            req->session_id(), session_id_, formed_ ? "" : " (not formed yet)")};
    } else if (req->node_rank() < 0 || req->node_rank() >= nnodes_) {
      status = {
          grpc::StatusCode::INVALID_ARGUMENT,
          fmt::format("leave from node rank {} (world of {} nodes)", req->node_rank(), nnodes_)};
    } else {
      Node& node = nodes_[static_cast<size_t>(req->node_rank())];
      if (req->reason().empty()) {
        if (node.state == v1::NODE_STATE_RUNNING) {
          node.state = v1::NODE_STATE_LEFT;
          node.reason = "left";
          fx.broadcast = true;
        }
      } else {
        node_died(node, fmt::format("failed: {}", req->reason()), fx);
      }
    }
    fx.finishes.emplace_back(reactor, std::move(status));
  }
  apply(fx);
  return reactor;
}

// --- Status, tick, shutdown ------------------------------------------------------------------

v1::WorldStatus RendezvousService::build_status() const {
  v1::WorldStatus s;
  for (const auto& r : ranks_) *s.add_ranks() = r;
  for (const Node& n : nodes_) {
    v1::NodeStatus* ns = s.add_nodes();
    ns->set_node_rank(n.entry.node_rank());
    ns->set_state(n.state);
    ns->set_reason(n.reason);
  }
  s.set_failed(failed_);
  s.set_failure(failure_);
  return s;
}

void RendezvousService::tick() {
  Effects fx;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    const auto now = Clock::now();
    tick_joins(now, fx);
    tick_store(now, fx);
    for (Node& node : nodes_) {
      if (node.state != v1::NODE_STATE_RUNNING || now - node.last_beat <= node.silence_timeout)
        continue;
      const auto silent =
          std::chrono::duration_cast<std::chrono::milliseconds>(now - node.last_beat);
      node_died(node,
                fmt::format("went silent: no heartbeat for {} ms (limit {} ms)", silent.count(),
                            node.silence_timeout.count()),
                fx);
    }
  }
  apply(fx);
}

void RendezvousService::shutdown() {
  Effects fx;
  std::vector<HeartbeatStream*> streams;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    const grpc::Status st = unavailable();
    for (Joiner& j : joiners_) fx.finishes.emplace_back(j.call.reactor, st);
    joiners_.clear();
    for (GetCall& c : gets_) fx.finishes.emplace_back(c.call.reactor, st);
    gets_.clear();
    for (WaitCall& c : waits_) fx.finishes.emplace_back(c.call.reactor, st);
    waits_.clear();
    for (BarrierCall& c : barrier_calls_) fx.finishes.emplace_back(c.call.reactor, st);
    barrier_calls_.clear();
    for (HeartbeatStream* s : streams_) {
      s->ref();
      streams.push_back(s);
    }
  }
  apply(fx);
  for (HeartbeatStream* s : streams) {
    s->finish(unavailable());
    s->unref();
  }
}

bool RendezvousService::formed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return formed_;
}

bool RendezvousService::failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_;
}

std::string RendezvousService::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

std::vector<v1::NodeStatus> RendezvousService::node_states() const {
  std::lock_guard<std::mutex> lock(mu_);
  const v1::WorldStatus s = build_status();
  return {s.nodes().begin(), s.nodes().end()};
}

bool RendezvousService::all_nodes_done() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!formed_) return false;
  for (const Node& n : nodes_)
    if (n.state == v1::NODE_STATE_RUNNING) return false;
  return true;
}

}  // namespace zerod
