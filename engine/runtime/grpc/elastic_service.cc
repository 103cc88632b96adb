#include "engine/runtime/grpc/elastic_service.h"

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <regex>

#include "core/error.h"
#include "engine/runtime/grpc/channel.h"
#include "engine/runtime/launch.h"
#include "engine/runtime/net.h"
#include "zerod.grpc.pb.h"

namespace zerod {
namespace {

WorkerEventKind event_of(v1::WorkerEvent e) {
  switch (e) {
    case v1::WORKER_EVENT_FAILED:
      return WorkerEventKind::kFailed;
    case v1::WORKER_EVENT_STOPPED:
      return WorkerEventKind::kStopped;
    case v1::WORKER_EVENT_FINISHED:
      return WorkerEventKind::kFinished;
    case v1::WORKER_EVENT_STOP_REQUESTED:
      return WorkerEventKind::kStopRequested;
    case v1::WORKER_EVENT_FATAL:
      return WorkerEventKind::kFatal;
    default:
      return WorkerEventKind::kRunning;
  }
}

v1::RoundAction action_of(AgentAction a) {
  switch (a) {
    case AgentAction::kRestart:
      return v1::ROUND_ACTION_RESTART;
    case AgentAction::kRejoin:
      return v1::ROUND_ACTION_REJOIN;
    case AgentAction::kStop:
      return v1::ROUND_ACTION_STOP;
    case AgentAction::kExit:
      return v1::ROUND_ACTION_EXIT;
    default:
      return v1::ROUND_ACTION_CONTINUE;
  }
}

v1::JobState state_of(const std::string& phase) {
  if (phase == "gathering") return v1::JOB_STATE_RENDEZVOUS;
  if (phase == "running") return v1::JOB_STATE_RUNNING;
  if (phase == "stopping") return v1::JOB_STATE_STOPPING;
  if (phase == "failed") return v1::JOB_STATE_FAILED;
  return v1::JOB_STATE_FINISHED;
}

template <class Msg>
void add_peers(Msg* m, const std::vector<ElasticPeer>& peers) {
  for (const ElasticPeer& p : peers) {
    v1::ElasticPeer* e = m->add_peers();
    e->set_node_rank(p.node_rank);
    e->set_instance(p.instance);
    e->set_hostname(p.hostname);
    e->set_address(p.address);
  }
}

}  // namespace

struct ElasticServer::Services {
  class Rendezvous final : public v1::ElasticRendezvous::Service {
   public:
    Rendezvous(ElasticRegistry& reg, int64_t term) : reg_(reg), term_(term) {}
    grpc::Status JoinRound(grpc::ServerContext*, const v1::RoundRequest* req,
                           v1::RoundResponse* resp) override {
      ElasticJoin j;
      j.job_hash = req->job_hash();
      j.node_rank = req->node_rank();
      j.nproc_per_node = req->nproc_per_node();
      j.min_nodes = req->min_nodes();
      j.max_nodes = req->max_nodes();
      j.hostname = req->hostname();
      j.address = req->address();
      j.port = req->port();
      j.epoch = req->epoch();
      j.instance = req->instance();
      const int64_t wait_ms = std::clamp<int64_t>(req->timeout_ms(), 0, 10000);
      ElasticRound r;
      try {
        r = reg_.join_and_wait(j, Clock::now() + std::chrono::milliseconds(wait_ms));
      } catch (const ElasticRefusal& e) {
        spdlog::warn("elastic: refused: {}", e.what());
        return {grpc::StatusCode::FAILED_PRECONDITION, e.what()};
      }
      if (r.over) return {grpc::StatusCode::ABORTED, r.reason};
      resp->set_formed(r.formed);
      resp->set_reason(r.reason);
      resp->set_node_rank(r.node_rank);
      resp->set_epoch(r.epoch);
      resp->set_round_rank(r.round_rank);
      for (int m : r.members) resp->add_members(m);
      resp->set_master(r.master);
      resp->set_restarts_used(r.restarts_used);
      resp->set_max_restarts(r.max_restarts);
      resp->set_last_recovery_seconds(r.last_recovery_seconds);
      add_peers(resp, r.peers);
      resp->set_host_term(term_);
      resp->set_steps_lost_total(r.steps_lost_total);
      return grpc::Status::OK;
    }
    grpc::Status AgentBeat(grpc::ServerContext*, const v1::AgentBeatRequest* req,
                           v1::AgentBeatResponse* resp) override {
      const AgentReply r =
          reg_.beat(req->node_rank(), req->instance(), req->epoch(), event_of(req->event()),
                    req->detail(), Clock::now(), req->steps_lost());
      resp->set_action(action_of(r.action));
      resp->set_reason(r.reason);
      resp->set_epoch(r.epoch);
      resp->set_failed(r.failed);
      resp->set_fatal(r.fatal);
      add_peers(resp, r.peers);
      resp->set_host_term(term_);
      resp->set_restarts_used(r.restarts_used);
      return grpc::Status::OK;
    }

   private:
    ElasticRegistry& reg_;
    const int64_t term_;
  };

  // zeroctl status: the membership, and the newest checkpoint as the job's progress.
  class Status final : public v1::Control::Service {
   public:
    Status(ElasticRegistry& reg, ElasticStatusInfo info, const ElasticHosting& hosting,
           std::string address)
        : reg_(reg), info_(std::move(info)), hosting_(hosting), address_(std::move(address)) {}
    grpc::Status GetStatus(grpc::ServerContext*, const v1::GetStatusRequest*,
                           v1::JobStatus* s) override {
      const ElasticView v = reg_.view(Clock::now());
      const ElasticConfig& c = reg_.config();
      s->set_state(state_of(v.phase));
      s->set_stopped(v.phase == "stopped");
      s->set_job_id("elastic");
      s->set_job_name(info_.job_name);
      s->set_reason(v.failure);
      s->set_total_steps(info_.total_steps);
      s->set_world_size(static_cast<int>(v.members.size()) * c.nproc_per_node);
      const std::string tag = info_.latest_checkpoint ? info_.latest_checkpoint() : "";
      if (!tag.empty()) {
        s->set_last_checkpoint(tag);
        std::smatch m;
        static const std::regex kStep("global_step([0-9]+)");
        if (std::regex_match(tag, m, kStep)) s->set_step(std::stoll(m[1].str()));
      }
      v1::ElasticMembership* e = s->mutable_elastic();
      e->set_epoch(v.epoch);
      for (int m : v.members) e->add_nodes(m);
      for (int w : v.waiting) e->add_waiting(w);
      e->set_min_nodes(c.min_nodes);
      e->set_max_nodes(c.max_nodes);
      e->set_restarts_used(v.restarts_used);
      e->set_max_restarts(c.max_restarts);
      e->set_last_recovery_seconds(v.last_recovery_seconds);
      e->set_since_last_recovery_seconds(v.since_last_recovery_seconds);
      e->set_last_change(v.last_change);
      e->set_host_node(hosting_.node_rank);
      e->set_host_term(hosting_.term);
      e->set_host_address(address_);
      e->set_steps_lost(v.steps_lost);
      e->set_steps_lost_total(v.steps_lost_total);
      return grpc::Status::OK;
    }

   private:
    ElasticRegistry& reg_;
    const ElasticStatusInfo info_;
    const ElasticHosting& hosting_;
    const std::string address_;
  };

  Services(ElasticRegistry& reg, ElasticStatusInfo info, const ElasticHosting& hosting,
           const std::string& address)
      : rdzv(reg, hosting.term), status(reg, std::move(info), hosting, address) {}
  Rendezvous rdzv;
  Status status;
};

ElasticServer::ElasticServer(const std::string& host, int port, ElasticConfig config,
                             ElasticStatusInfo info, ElasticHosting hosting)
    : address_(join_host_port(host, port)),
      hosting_(std::move(hosting)),
      registry_(hosting_.takeover
                    ? std::make_unique<ElasticRegistry>(std::move(config), *hosting_.takeover)
                    : std::make_unique<ElasticRegistry>(std::move(config))) {
  switch (probe_tcp_bind(host, port)) {
    case BindResult::kFree:
      break;
    case BindResult::kInUse:
      ZD_THROW_INPUT(
          "{} is already in use: another zerod (or another program) listens there; stop "
          "it or choose another --master port",
          address_);
    case BindResult::kNotLocal:
      ZD_THROW_INPUT(
          "cannot host the elastic rendezvous at {}: {} is not an address of this "
          "machine (node 0 must run on the --master host)",
          address_, host);
  }
  services_ = std::make_unique<Services>(*registry_, std::move(info), hosting_, address_);
  grpc::ServerBuilder builder;
  int bound = 0;
  builder.AddListeningPort(address_, grpc::InsecureServerCredentials(), &bound);
  builder.RegisterService(&services_->rdzv);
  builder.RegisterService(&services_->status);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  server_ = builder.BuildAndStart();
  if (!server_ || bound == 0) ZD_THROW_INPUT("{} is already in use", address_);
  if (!hosting_.lease_path.empty()) {
    lease_ = std::make_unique<ElasticHostLease>(hosting_.lease_path, hosting_.term, address_,
                                                hosting_.node_rank, hosting_.instance);
  }
  timer_ = std::thread([this] {
    bool fenced = false;
    for (int tick = 0; !stopping_.load(); ++tick) {
      registry_->tick(Clock::now());
      // The lease every 4 ticks (200 ms, the beat interval); a higher term there means another
      // node took the rendezvous over while this one was presumed dead: this one must not go on.
      if (lease_ && !fenced && tick % 4 == 0) {
        bool mine = true;
        try {
          mine = lease_->refresh();
        } catch (const std::exception& e) {
          spdlog::warn("elastic: {}", e.what());
        }
        if (!mine) {
          fenced = true;
          const auto rec = ElasticHostLease::read(lease_->path());
          registry_->abandon(fmt::format(
              "this rendezvous (term {}) was taken over by node {} at {} (term {}, {}) while it "
              "was presumed dead: its agents stop; the job goes on there",
              lease_->term(), rec ? rec->node_rank : -1, rec ? rec->address : "?",
              rec ? rec->term : 0, lease_->path()));
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  spdlog::info("elastic: rendezvous serving at {} (term {})", address_, hosting_.term);
}

ElasticServer::~ElasticServer() {
  stop();
}

void ElasticServer::stop() {
  if (stopping_.exchange(true)) return;
  if (timer_.joinable()) timer_.join();
  // The job is over here: the lease goes with its host (unless another node's term is there).
  if (lease_) {
    const auto rec = ElasticHostLease::read(lease_->path());
    std::error_code ec;
    if (rec && rec->term == lease_->term()) std::filesystem::remove(lease_->path(), ec);
  }
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    server_->Wait();
  }
}

}  // namespace zerod
