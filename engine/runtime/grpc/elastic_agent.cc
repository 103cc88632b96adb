#include "engine/runtime/grpc/elastic_agent.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <grpcpp/grpcpp.h>
#include <netdb.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <thread>

#include "core/error.h"
#include "engine/runtime/elastic_host_lease.h"
#include "engine/runtime/grpc/channel.h"
#include "engine/runtime/launch.h"
#include "engine/runtime/net.h"
#include "engine/runtime/signals.h"
#include "zerod.grpc.pb.h"

extern char** environ;

namespace zerod {
namespace {

using namespace std::chrono_literals;

constexpr auto kBeatInterval = 200ms;
constexpr auto kPoll = 20ms;

std::string random_instance() {
  std::random_device rd;
  return fmt::format("{:08x}{:08x}{:x}", rd(), rd(), ::getpid());
}

// A TCP port free on `host` a moment ago (the round's worker rendezvous binds it).
int pick_free_port(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), "0", &hints, &res) != 0 || res == nullptr) return 0;
  int port = 0;
  const int fd = ::socket(res->ai_family, SOCK_STREAM, 0);
  if (fd >= 0 && ::bind(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_storage a{};
    socklen_t len = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = a.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port)
                                   : ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port);
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(res);
  return port;
}

// Starts the worker; it is SIGKILLed when this process dies (kill -9 of the node takes both).
pid_t spawn_worker(const std::vector<std::string>& args,
                   const std::vector<std::string>& extra_env) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "ZEROD_ELASTIC_", 14) != 0) env.emplace_back(*e);
  }
  env.insert(env.end(), extra_env.begin(), extra_env.end());
  std::vector<char*> argv, envp;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) ZD_THROW("fork of the worker failed: {}", std::strerror(errno));
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the agent died before prctl
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execve("/proc/self/exe", argv.data(), envp.data());
    ::_exit(127);
  }
  return pid;
}

// The exit code of `pid` once it exited (128 + signal when killed), without waiting.
std::optional<int> poll_exit(pid_t pid) {
  int status = 0;
  const pid_t r = ::waitpid(pid, &status, WNOHANG);
  if (r != pid) return std::nullopt;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int wait_exit(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string describe_exit(int code) {
  if (code == 0) return "exit 0 (trained the last step)";
  if (code == kWorkerStoppedExit) return fmt::format("exit {} (stopped with a save)", code);
  if (code > 128) return fmt::format("killed by signal {}", code - 128);
  return fmt::format("exit {}{}", code, code == 3 ? " (lost a peer)" : "");
}

class Agent {
 public:
  explicit Agent(const ElasticAgentOptions& o)
      : o_(o),
        master_(join_host_port(o.master_host, o.master_port)),
        instance_(random_instance()),
        node_rank_(o.node_rank) {}

  int run() {
    // Node 0 hosts the rendezvous; so does a node without a rank that can bind --master. A
    // node 0 finding it taken joins as a client: a second node 0 is refused by the first.
    // A fresh lease names the live host of this job (another node took the rendezvous over
    // from node 0): join there rather than host a second rendezvous.
    const std::optional<ElasticHostRecord> lease =
        o_.lease_path.empty() ? std::nullopt : ElasticHostLease::read(o_.lease_path);
    std::optional<ElasticHostRecord> live_host;
    if (lease && lease->age_seconds < heartbeat_seconds()) live_host = lease;
    const BindResult bind = probe_tcp_bind(o_.master_host, o_.master_port);
    if (node_rank_ == 0 && bind == BindResult::kNotLocal && !live_host) {
      ZD_THROW_INPUT(
          "cannot host the elastic rendezvous at {}: {} is not an address of this "
          "machine (node 0 must run on the --master host)",
          master_, o_.master_host);
    }
    const bool host = node_rank_ <= 0 && bind == BindResult::kFree && !live_host;
    if (live_host && live_host->address != master_) {
      spdlog::info(
          "elastic: node {}: node {} hosts the rendezvous at {} now (term {}, {}), not {}: "
          "joining there",
          node_rank_, live_host->node_rank, live_host->address, live_host->term, o_.lease_path,
          master_);
      master_ = live_host->address;
    }
    if (host) {
      ElasticConfig c = o_.config;
      c.host_instance = instance_;
      server_ = std::make_unique<ElasticServer>(o_.master_host, o_.master_port, c, o_.status,
                                                ElasticHosting{.lease_path = o_.lease_path,
                                                               .term = lease ? lease->term + 1 : 1,
                                                               .node_rank = std::max(node_rank_, 0),
                                                               .instance = instance_});
    }
    if (!o_.snapshot_root.empty()) {
      snapshot_dir_ = fmt::format("{}/zerod-snapshot-{}", o_.snapshot_root, instance_);
      std::error_code ec;
      std::filesystem::create_directories(snapshot_dir_, ec);
      if (ec) ZD_THROW_INPUT("snapshot.dir: cannot create {}: {}", snapshot_dir_, ec.message());
      spdlog::info("elastic: node {}: in-memory snapshots in {}", node_rank_, snapshot_dir_);
    }
    // The node's snapshots go with the agent, however it ends (but kill -9).
    struct RemoveSnapshots {
      const std::string& dir;
      ~RemoveSnapshots() {
        std::error_code ec;
        if (!dir.empty()) std::filesystem::remove_all(dir, ec);
      }
    } remove_snapshots{snapshot_dir_};
    stub_ = v1::ElasticRendezvous::NewStub(make_rendezvous_channel(master_));
    address_ = local_address_towards(o_.master_host, o_.master_port);
    int code = loop();
    if (code == 3 && server_ && o_.save_snapshot && !snapshot_dir_.empty()) {
      // Below MIN or out of restarts: what this node holds in memory may be newer than disk.
      try {
        if (const std::string saved = o_.save_snapshot(snapshot_dir_); !saved.empty())
          spdlog::warn("elastic: node {}: {}", node_rank_, saved);
      } catch (const std::exception& e) {
        spdlog::error("elastic: node {}: the in-memory snapshot could not be saved: {}", node_rank_,
                      e.what());
      }
    }
    if (server_) {
      // The other agents learn the end from their next beat: serve them a moment longer.
      std::this_thread::sleep_for(3 * kBeatInterval + 200ms);
      server_->stop();
    }
    return code;
  }

 private:
  int loop() {
    for (;;) {
      v1::RoundResponse round;
      if (const auto code = join_round(round)) return *code;
      const int code = run_round(round);
      if (code >= 0) return code;
    }
  }

  // Joins the next round (fills `round`), or returns the exit code when the job is over.
  std::optional<int> join_round(v1::RoundResponse& round) {
    const auto start = Clock::now();
    auto unreachable_since = Clock::now();
    std::string said;
    for (;;) {
      if (stop_requested()) {
        spdlog::info("elastic: node {}: stop requested while no worker runs: exiting", node_rank_);
        if (node_rank_ >= 0) beat(v1::WORKER_EVENT_STOP_REQUESTED, "signal");
        return 0;
      }
      v1::RoundRequest req;
      req.set_job_hash(o_.config.job_hash);
      req.set_node_rank(node_rank_);
      req.set_nproc_per_node(o_.config.nproc_per_node);
      req.set_min_nodes(o_.config.min_nodes);
      req.set_max_nodes(o_.config.max_nodes);
      req.set_hostname(local_hostname());
      req.set_address(address_);
      req.set_port(pick_free_port(address_));
      req.set_epoch(epoch_);
      req.set_timeout_ms(1000);
      req.set_instance(instance_);
      grpc::ClientContext ctx;
      prepare_context(ctx, 3s);
      ctx.set_wait_for_ready(true);  // node 0 may not listen yet
      const grpc::Status st = stub_->JoinRound(&ctx, req, &round);
      if (st.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
        spdlog::error("elastic: refused by the rendezvous at {}: {}", master_, st.error_message());
        ZD_THROW_INPUT("{}", st.error_message());
      }
      if (st.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
        ZD_THROW_INPUT(
            "{} is in use, but not by the elastic rendezvous of a zerod job (another "
            "program, or a zerod without --nnodes MIN:MAX, listens there)",
            master_);
      }
      if (st.error_code() == grpc::StatusCode::ABORTED) {
        const bool done = st.error_message() == "the job is over";
        if (done)
          spdlog::info("elastic: node {}: {}", node_rank_, st.error_message());
        else
          spdlog::error("elastic: node {}: {}", node_rank_, st.error_message());
        return done ? 0 : 3;
      }
      if (!st.ok()) {
        const auto limit = host_term_ == 0 ? o_.first_round_timeout : o_.config.heartbeat_timeout;
        if (Clock::now() - unreachable_since > limit) {
          if (host_term_ > 0 && find_new_host(describe_status(st))) {
            unreachable_since = Clock::now();
            continue;
          }
          ZD_THROW_KIND(ErrorKind::kPeerLost,
                        "the elastic rendezvous at {} is unreachable ({}): the job "
                        "cannot go on without it",
                        master_, describe_status(st));
        }
        std::this_thread::sleep_for(100ms);
        continue;
      }
      unreachable_since = Clock::now();
      heard_from_host(round.peers(), round.host_term(), round.epoch(), round.restarts_used(),
                      round.steps_lost_total());
      node_rank_ = round.node_rank();
      if (round.formed()) return std::nullopt;
      if (round.reason() != said) {
        spdlog::info("elastic: node {} waits: {}", node_rank_, round.reason());
        said = round.reason();
      }
      if (epoch_ == 0 && Clock::now() - start > o_.first_round_timeout) {
        ZD_THROW_KIND(
            ErrorKind::kPeerLost, "no round formed within {:.0f} s (train.rendezvous_timeout): {}",
            std::chrono::duration<double>(o_.first_round_timeout).count(), round.reason());
      }
    }
  }

  // Runs the worker of `round`; returns the exit code when the job is over, -1 to rejoin.
  int run_round(const v1::RoundResponse& round) {
    epoch_ = round.epoch();
    const int n = round.members_size();
    std::vector<std::string> args = {"/proc/self/exe"};
    args.insert(args.end(), o_.global_args.begin(), o_.global_args.end());
    args.insert(args.end(), o_.worker_args.begin(), o_.worker_args.end());
    for (const std::string& a :
         {std::string("--nnodes"), std::to_string(n), std::string("--node-rank"),
          std::to_string(round.round_rank()), std::string("--master"), round.master(),
          std::string("--nproc-per-node"), std::to_string(o_.config.nproc_per_node)}) {
      args.push_back(a);
    }
    const std::string resume = epoch_ == 1 ? o_.resume : "auto";
    if (!resume.empty()) {
      args.push_back("--resume");
      args.push_back(resume);
    }
    const std::vector<std::string> env = {
        fmt::format("{}=1", kElasticAgentEnv),
        fmt::format("ZEROD_ELASTIC_EPOCH={}", epoch_),
        fmt::format("ZEROD_ELASTIC_NODE_RANK={}", node_rank_),
        fmt::format("ZEROD_ELASTIC_NODES={}", fmt::join(round.members(), ",")),
        fmt::format("ZEROD_ELASTIC_MIN_NODES={}", o_.config.min_nodes),
        fmt::format("ZEROD_ELASTIC_MAX_NODES={}", o_.config.max_nodes),
        fmt::format("ZEROD_ELASTIC_RESTARTS={}", round.restarts_used()),
        fmt::format("ZEROD_ELASTIC_MAX_RESTARTS={}", round.max_restarts()),
        fmt::format("ZEROD_ELASTIC_LAST_RECOVERY_SECONDS={}", round.last_recovery_seconds()),
        fmt::format("ZEROD_ELASTIC_SNAPSHOT_DIR={}", snapshot_dir_),
        fmt::format("ZEROD_ELASTIC_STEPS_LOST_TOTAL={}", round.steps_lost_total())};
    // The worker writes how it restored (memory_snapshot.h): passed on once, in a beat.
    std::string reported;
    if (!snapshot_dir_.empty()) std::filesystem::remove(snapshot_dir_ + "/recovery");
    const pid_t pid = spawn_worker(args, env);
    spdlog::info(
        "elastic: node {}: epoch {}: round rank {} of {} (nodes {}), worker pid {} (--resume {})",
        node_rank_, epoch_, round.round_rank(), n, fmt::join(round.members(), ", "), pid,
        resume.empty() ? "none" : resume);
    bool forwarded_stop = false, asked_stop = false;
    auto next_beat = Clock::now();
    auto last_reply = Clock::now();
    std::optional<int> code;
    while (!(code = poll_exit(pid))) {
      if (stop_requested() && !forwarded_stop) {
        forwarded_stop = true;
        spdlog::info(
            "elastic: node {}: stop requested: the workers stop at the next step with "
            "a save",
            node_rank_);
        beat(v1::WORKER_EVENT_STOP_REQUESTED, "signal");
        if (!asked_stop) ::kill(pid, SIGTERM);  // one SIGTERM: a second exits at once
        asked_stop = true;
      }
      if (Clock::now() >= next_beat) {
        next_beat = Clock::now() + kBeatInterval;
        auto [restored, steps_lost] = read_recovery();
        if (restored == reported) restored.clear();
        if (auto r = beat(v1::WORKER_EVENT_RUNNING, restored, restored.empty() ? -1 : steps_lost)) {
          if (!restored.empty()) reported = restored;
          last_reply = Clock::now();
          heard_from_host(r->peers(), r->host_term(), r->epoch(), r->restarts_used());
          switch (r->action()) {
            case v1::ROUND_ACTION_RESTART:
              spdlog::warn("elastic: node {}: restarting the worker: {}", node_rank_, r->reason());
              ::kill(pid, SIGKILL);
              wait_exit(pid);
              return -1;
            case v1::ROUND_ACTION_REJOIN:
            case v1::ROUND_ACTION_STOP:
              if (!asked_stop) {
                asked_stop = true;
                spdlog::info(
                    "elastic: node {}: {}: stopping the worker at the next step with a "
                    "save",
                    node_rank_, r->reason());
                ::kill(pid, SIGTERM);
              }
              break;
            case v1::ROUND_ACTION_EXIT:
              return end_with_worker(pid, *r);
            default:
              break;
          }
        } else if (Clock::now() - last_reply > o_.config.heartbeat_timeout) {
          // The host is lost (its node died, or its worker's round with it): this round is over.
          ::kill(pid, SIGKILL);
          wait_exit(pid);
          if (find_new_host("no beat answered")) return -1;
          ZD_THROW_KIND(ErrorKind::kPeerLost,
                        "the elastic rendezvous at {} stopped answering: the job cannot "
                        "go on without it",
                        master_);
        }
      }
      std::this_thread::sleep_for(kPoll);
    }
    spdlog::info("elastic: node {}: epoch {}: worker {}", node_rank_, epoch_, describe_exit(*code));
    v1::WorkerEvent ev = v1::WORKER_EVENT_FAILED;
    if (*code == 0) ev = v1::WORKER_EVENT_FINISHED;
    if (*code == kWorkerStoppedExit) ev = v1::WORKER_EVENT_STOPPED;
    if (*code == 2) ev = v1::WORKER_EVENT_FATAL;
    // Report until told what comes next.
    auto last = Clock::now();
    for (;;) {
      if (auto r = beat(ev, describe_exit(*code))) {
        last = Clock::now();
        heard_from_host(r->peers(), r->host_term(), r->epoch(), r->restarts_used());
        if (r->action() == v1::ROUND_ACTION_EXIT) return exit_code(*r);
        if (r->action() == v1::ROUND_ACTION_RESTART || r->action() == v1::ROUND_ACTION_REJOIN)
          return -1;
      } else if (Clock::now() - last > o_.config.heartbeat_timeout) {
        // The host ended (its agent exits once the job is over): a finished or stopped worker
        // has nothing left to do.
        if (ev == v1::WORKER_EVENT_FINISHED || ev == v1::WORKER_EVENT_STOPPED) return 0;
        if (find_new_host("no beat answered after the worker's " + describe_exit(*code))) return -1;
        ZD_THROW_KIND(ErrorKind::kPeerLost,
                      "the elastic rendezvous at {} stopped answering after the worker's "
                      "{}",
                      master_, describe_exit(*code));
      }
      std::this_thread::sleep_for(kBeatInterval);
    }
  }

  int exit_code(const v1::AgentBeatResponse& r) const {
    if (!r.failed()) {
      spdlog::info("elastic: node {}: {}", node_rank_, r.reason());
      return 0;
    }
    spdlog::error("elastic: node {}: {}", node_rank_, r.reason());
    return r.fatal() ? 2 : 3;
  }

  // The job is over while the worker runs: a failed job kills it, a finished or stopping one
  // lets it end (with its save).
  int end_with_worker(pid_t pid, const v1::AgentBeatResponse& r) {
    ::kill(pid, r.failed() ? SIGKILL : SIGTERM);
    wait_exit(pid);
    return exit_code(r);
  }

  std::optional<v1::AgentBeatResponse> beat(v1::WorkerEvent ev, const std::string& detail,
                                            int64_t steps_lost = -1) {
    v1::AgentBeatRequest req;
    req.set_node_rank(node_rank_);
    req.set_epoch(epoch_);
    req.set_event(ev);
    req.set_detail(detail);
    req.set_instance(instance_);
    req.set_steps_lost(steps_lost);
    v1::AgentBeatResponse resp;
    grpc::ClientContext ctx;
    prepare_context(ctx, 1s);
    if (!stub_->AgentBeat(&ctx, req, &resp).ok()) return std::nullopt;
    return resp;
  }

  double heartbeat_seconds() const {
    return std::chrono::duration<double>(o_.config.heartbeat_timeout).count();
  }

  // What the host's last reply said about who would take it over.
  template <class Peers>
  void heard_from_host(const Peers& peers, int64_t term, int64_t epoch, int restarts,
                       int64_t steps_lost_total = -1) {
    peers_.clear();
    for (const auto& p : peers)
      peers_.push_back({p.node_rank(), p.instance(), p.hostname(), p.address()});
    host_term_ = term;
    job_epoch_ = std::max(job_epoch_, epoch);
    restarts_used_ = restarts;
    if (steps_lost_total >= 0) steps_lost_total_ = steps_lost_total;
  }

  // The rendezvous host stopped answering (docs/elastic.md, "Node 0 dies"). The lease file
  // decides who hosts next: a higher term written by another node -> join there; still the lost
  // host's term, stale for (1 + i) heartbeat timeouts, and this agent the i-th live successor in
  // the host's last list -> take the rendezvous over at this node's address and --master's
  // port. The lost host's term still fresh -> it lives but cannot be reached: wait, then give
  // up. Returns false when no host took over.
  bool find_new_host(const std::string& why) {
    if (o_.lease_path.empty() || host_term_ == 0 || server_) return false;
    int index = -1;
    for (size_t i = 0; i < peers_.size(); ++i)
      if (peers_[i].instance == instance_) index = static_cast<int>(i);
    const double hb = heartbeat_seconds();
    const auto deadline = Clock::now() + (peers_.size() + 2) * o_.config.heartbeat_timeout;
    spdlog::warn(
        "elastic: node {}: the rendezvous at {} (term {}) is lost ({}); the next host by the "
        "lease {}: node {}",
        node_rank_, master_, host_term_, why, o_.lease_path,
        peers_.empty() ? std::string("none") : std::to_string(peers_.front().node_rank));
    while (Clock::now() < deadline) {
      const auto rec = ElasticHostLease::read(o_.lease_path);
      if (rec && rec->term > host_term_ && rec->age_seconds < hb) {
        spdlog::warn("elastic: node {}: node {} took the rendezvous over at {} (term {})",
                     node_rank_, rec->node_rank, rec->address, rec->term);
        switch_host(rec->address, rec->term);
        return true;
      }
      const bool stale = !rec || (rec->term == host_term_ && rec->age_seconds > hb * (1 + index));
      if (index >= 0 && stale) {
        try {
          take_over(rec, why);
        } catch (const std::exception& e) {
          spdlog::error("elastic: node {}: cannot take the rendezvous over: {}", node_rank_,
                        e.what());
          return false;
        }
        return true;
      }
      if (stop_requested()) return false;
      std::this_thread::sleep_for(100ms);
    }
    return false;
  }

  void take_over(const std::optional<ElasticHostRecord>& lost, const std::string& why) {
    ElasticTakeover t;
    t.epoch = job_epoch_;
    t.restarts_used = restarts_used_;
    t.steps_lost_total = steps_lost_total_;
    t.agents = peers_;
    t.lost_rank = lost ? lost->node_rank : -1;
    t.lost_instance = lost ? lost->instance : "";
    t.silent_seconds = lost ? lost->age_seconds : 0.0;
    t.why = fmt::format(
        "the rendezvous host stopped answering ({}; its lease {} not renewed "
        "for {:.1f} s)",
        why, o_.lease_path, lost ? lost->age_seconds : 0.0);
    ElasticConfig c = o_.config;
    c.host_instance = instance_;
    const int64_t term = host_term_ + 1;
    server_ = std::make_unique<ElasticServer>(address_, o_.master_port, c, o_.status,
                                              ElasticHosting{.lease_path = o_.lease_path,
                                                             .term = term,
                                                             .node_rank = node_rank_,
                                                             .instance = instance_,
                                                             .takeover = t});
    spdlog::warn("elastic: node {}: took the rendezvous over at {} (term {}): {}", node_rank_,
                 server_->address(), term, t.why);
    switch_host(server_->address(), term);
  }

  void switch_host(const std::string& address, int64_t term) {
    master_ = address;
    host_term_ = term;
    stub_ = v1::ElasticRendezvous::NewStub(make_rendezvous_channel(master_));
  }

  // The worker's restore line and the steps it lost (-1: not said).
  std::pair<std::string, int64_t> read_recovery() const {
    if (snapshot_dir_.empty()) return {"", -1};
    std::ifstream in(snapshot_dir_ + "/recovery");
    std::string line, key;
    int64_t lost = -1;
    std::getline(in, line);
    if (!(in >> key >> lost) || key != "steps_lost") lost = -1;
    return {line, lost};
  }

  std::string snapshot_dir_;
  const ElasticAgentOptions& o_;
  std::string master_;
  const std::string instance_;
  int node_rank_;
  int64_t epoch_ = 0;
  std::string address_;
  std::unique_ptr<ElasticServer> server_;
  std::unique_ptr<v1::ElasticRendezvous::Stub> stub_;
  // From the host's last reply: the live agents but the host, by node rank (its successors),
  // its lease term, the job's epoch and restarts.
  std::vector<ElasticPeer> peers_;
  int64_t host_term_ = 0;
  int64_t job_epoch_ = 0;
  int restarts_used_ = 0;
  int64_t steps_lost_total_ = 0;
};

}  // namespace

int run_elastic_agent(const ElasticAgentOptions& options) {
  return Agent(options).run();
}

}  // namespace zerod
