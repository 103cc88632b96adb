#include "engine/runtime/elastic_registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "engine/runtime/launch.h"

namespace zerod {
namespace {

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

ElasticRegistry::ElasticRegistry(ElasticConfig config) : cfg_(std::move(config)) {
  gathering_since_ = Clock::now();
}

ElasticRegistry::ElasticRegistry(ElasticConfig config, const ElasticTakeover& t)
    : cfg_(std::move(config)) {
  const auto now = Clock::now();
  epoch_ = t.epoch;
  restarts_used_ = t.restarts_used;
  steps_lost_total_ = t.steps_lost_total;
  // The survivors are expected back (their workers lost the host's): each is dropped like any
  // silent agent when it does not rejoin within the heartbeat timeout.
  for (const ElasticPeer& p : t.agents) {
    Agent& a = agents_[p.node_rank];
    a.rank = p.node_rank;
    a.instance = p.instance;
    a.hostname = p.hostname;
    a.address = p.address;
    a.last_beat = now;
  }
  if (t.lost_rank >= 0 && !agents_.count(t.lost_rank)) {
    Agent& lost = agents_[t.lost_rank];
    lost.rank = t.lost_rank;
    lost.instance = t.lost_instance;
    lost.alive = false;
    lost.epoch = t.epoch;
    lost.left = t.why;
  }
  last_change_ = t.lost_rank >= 0 ? fmt::format("node {} left: {}", t.lost_rank, t.why) : t.why;
  spdlog::warn("elastic: took the rendezvous over at epoch {}: {}", epoch_, last_change_);
  // As close_round(kRestart) of the lost host's running round; the recovery counts from the
  // host's last sign of life.
  failed_at_ = now - std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(t.silent_seconds));
  phase_ = Phase::kRunning;
  close_round(Closing::kRestart, last_change_, now);
}

void ElasticRegistry::abandon(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  fail(why, false);
}

std::vector<ElasticPeer> ElasticRegistry::peers() const {
  std::vector<ElasticPeer> out;
  for (const auto& [rank, a] : agents_) {
    if (a.alive && a.instance != cfg_.host_instance)
      out.push_back({a.rank, a.instance, a.hostname, a.address});
  }
  return out;
}

std::string ElasticRegistry::describe(const Agent& a) const {
  return fmt::format("node {} ({}, {})", a.rank, a.hostname, a.address);
}

std::string ElasticRegistry::names(const std::vector<int>& ranks) const {
  return ranks.empty() ? std::string("none") : fmt::format("{}", fmt::join(ranks, ", "));
}

int ElasticRegistry::largest_admissible(int count) const {
  int best = 0;
  for (int n : cfg_.admissible)
    if (n <= count) best = std::max(best, n);
  return best;
}

bool ElasticRegistry::over() const {
  return phase_ == Phase::kFinished || phase_ == Phase::kStopped || phase_ == Phase::kFailed;
}

void ElasticRegistry::validate(const ElasticJoin& req) const {
  const std::string who =
      req.node_rank >= 0 ? fmt::format("node {}", req.node_rank) : std::string("a node");
  const std::string from = fmt::format("{} ({}, {})", who, req.hostname, req.address);
  if (req.job_hash != cfg_.job_hash) {
    throw ElasticRefusal(fmt::format(
        "{} runs a different job (config hash {}, the job's is {}): every node must run the same "
        "job file",
        from, req.job_hash, cfg_.job_hash));
  }
  if (req.nproc_per_node != cfg_.nproc_per_node) {
    throw ElasticRefusal(fmt::format("{} has --nproc-per-node {}, the job {}", from,
                                     req.nproc_per_node, cfg_.nproc_per_node));
  }
  if (req.min_nodes != cfg_.min_nodes || req.max_nodes != cfg_.max_nodes) {
    throw ElasticRefusal(fmt::format("{} has --nnodes {}:{}, the job {}:{}", from, req.min_nodes,
                                     req.max_nodes, cfg_.min_nodes, cfg_.max_nodes));
  }
  // An agent of an older epoch is one that is still registered (waiting, or polling for the
  // round it was just put in); any other was dropped.
  const auto known = req.node_rank >= 0 ? agents_.find(req.node_rank) : agents_.end();
  const bool registered =
      known != agents_.end() && known->second.instance == req.instance && known->second.alive;
  if (req.epoch > epoch_ || (req.epoch > 0 && req.epoch < epoch_ && !registered)) {
    throw ElasticRefusal(fmt::format(
        "{} comes from membership epoch {}, but the job is at epoch {}: it was dropped from the "
        "job (or belongs to another one) and cannot train beside the current round; restart it "
        "to join as a new node",
        from, req.epoch, epoch_));
  }
  if (req.node_rank >= 0) {
    auto it = agents_.find(req.node_rank);
    if (it != agents_.end() && it->second.alive && it->second.instance != req.instance) {
      throw ElasticRefusal(fmt::format(
          "node rank {} is taken: {} already holds it; give each node its own --node-rank (or "
          "none, to have one assigned)",
          req.node_rank, describe(it->second)));
    }
    if (it != agents_.end() && !it->second.alive && it->second.instance == req.instance) {
      throw ElasticRefusal(fmt::format(
          "{} was dropped from the job at epoch {} ({}); restart it to join as a new node", from,
          it->second.epoch, it->second.left));
    }
  }
}

int ElasticRegistry::assign_rank() const {
  int r = 0;
  while (agents_.count(r) && agents_.at(r).alive) ++r;
  return r;
}

ElasticRound ElasticRegistry::round_for(const Agent& a) const {
  ElasticRound r;
  r.node_rank = a.rank;
  r.epoch = epoch_;
  r.restarts_used = restarts_used_;
  r.max_restarts = cfg_.max_restarts;
  r.last_recovery_seconds = last_recovery_seconds_;
  r.peers = peers();
  r.steps_lost_total = steps_lost_total_;
  if (over()) {
    r.over = true;
    r.reason = phase_ == Phase::kFailed ? failure_ : "the job is over";
    return r;
  }
  if (phase_ == Phase::kRunning && a.member && !a.waiting) {
    r.formed = true;
    r.members = members_;
    r.master = master_;
    r.round_rank =
        static_cast<int>(std::find(members_.begin(), members_.end(), a.rank) - members_.begin());
    return r;
  }
  if (phase_ == Phase::kRunning) {
    r.reason = fmt::format(
        "standby: epoch {} runs with nodes {} and no larger node count in {} "
        "is admissible yet",
        epoch_, names(members_), names(cfg_.admissible));
  } else {
    int live = 0;
    for (const auto& [rank, ag] : agents_) live += ag.alive ? 1 : 0;
    r.reason = fmt::format("gathering: {} live node(s), admissible node counts {}", live,
                           names(cfg_.admissible));
  }
  return r;
}

ElasticRound ElasticRegistry::join(const ElasticJoin& req, Clock::time_point now) {
  std::unique_lock<std::mutex> lock(mu_);
  if (over()) {
    ElasticRound r;
    r.over = true;
    r.reason = phase_ == Phase::kFailed ? failure_ : "the job is over";
    return r;
  }
  validate(req);
  const int rank = req.node_rank >= 0 ? req.node_rank : assign_rank();
  Agent& a = agents_[rank];
  const bool fresh = a.instance != req.instance;
  if (fresh) {
    a = Agent{};
    a.rank = rank;
    a.instance = req.instance;
  }
  a.hostname = req.hostname;
  a.address = req.address;
  a.port = req.port;
  a.alive = true;
  a.last_beat = now;
  if (!fresh && req.epoch < a.epoch) return round_for(a);  // polling: its round formed meanwhile
  if (!fresh && a.member && phase_ == Phase::kRunning) {
    // Rejoining from the running round: its worker ended without a report.
    last_change_ = fmt::format("node {}'s worker ended", rank);
    close_round(Closing::kRestart, last_change_, now);
    if (over()) return round_for(a);
  }
  if (!a.waiting) {
    a.waiting = true;
    a.member = false;
    if (fresh) {
      spdlog::info("elastic: {} joined (epoch {}{})", describe(a), epoch_,
                   phase_ == Phase::kRunning ? ": admitted at the next step boundary" : "");
      last_change_ = fmt::format("node {} joined", rank);
    }
  }
  try_form(now);
  cv_.notify_all();
  return round_for(a);
}

ElasticRound ElasticRegistry::join_and_wait(const ElasticJoin& req, Clock::time_point deadline) {
  ElasticRound r = join(req, Clock::now());
  if (r.formed || r.over) return r;
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_until(lock, deadline, [&] {
    auto it = agents_.find(r.node_rank);
    return over() || it == agents_.end() || !it->second.alive ||
           (phase_ == Phase::kRunning && it->second.member && !it->second.waiting);
  });
  auto it = agents_.find(r.node_rank);
  if (it == agents_.end() || !it->second.alive) {
    ElasticRound lost = r;
    lost.over = true;
    lost.reason = fmt::format("node {} was dropped from the job", r.node_rank);
    return lost;
  }
  return round_for(it->second);
}

void ElasticRegistry::try_form(Clock::time_point now) {
  if (phase_ != Phase::kGathering) {
    // A running round admits waiting agents when a larger node count becomes admissible.
    if (phase_ != Phase::kRunning) return;
    int live = 0;
    for (const auto& [rank, a] : agents_) live += a.alive ? 1 : 0;
    if (largest_admissible(live) > static_cast<int>(members_.size())) {
      std::vector<int> joiners;
      for (const auto& [rank, a] : agents_)
        if (a.alive && !a.member) joiners.push_back(rank);
      close_round(Closing::kRejoin, fmt::format("node(s) {} waiting to join", names(joiners)), now);
    }
    return;
  }
  std::vector<int> ready;
  int pending = 0;
  for (const auto& [rank, a] : agents_) {
    if (!a.alive) continue;
    if (a.waiting)
      ready.push_back(rank);
    else
      ++pending;
  }
  const int n = largest_admissible(static_cast<int>(ready.size()));
  if (pending > 0) return;  // a member of the closed round is still winding its worker down
  if (n == 0) {
    if (epoch_ > 0 && now - gathering_since_ >= cfg_.below_min_timeout) {
      fail(fmt::format("the job has {} live node(s) ({}), below the smallest node count it can "
                       "train at ({} of --nnodes {}:{}), for {:.0f} s (train.rendezvous_timeout); "
                       "restart it with more nodes (--resume latest)",
                       ready.size(), names(ready), cfg_.admissible.front(), cfg_.min_nodes,
                       cfg_.max_nodes,
                       std::chrono::duration<double>(cfg_.below_min_timeout).count()),
           false);
    }
    return;
  }
  if (epoch_ == 0 && n < cfg_.max_nodes) {
    // The first round waits the settle time for more nodes once it could start.
    if (!min_reached_) min_reached_ = now;
    if (now - *min_reached_ < cfg_.settle) return;
  }
  std::sort(ready.begin(), ready.end());
  members_.assign(ready.begin(), ready.begin() + n);
  const Agent& first = agents_.at(members_[0]);
  master_ = join_host_port(first.address, first.port);
  ++epoch_;
  for (auto& [rank, a] : agents_) {
    const bool in = std::find(members_.begin(), members_.end(), rank) != members_.end();
    a.member = in;
    if (in) {
      a.waiting = false;
      a.epoch = epoch_;
    }
  }
  phase_ = Phase::kRunning;
  closing_ = Closing::kNone;
  if (failed_at_) {
    last_recovery_seconds_ = seconds_between(*failed_at_, now);
    last_recovered_at_ = now;
    failed_at_.reset();
  }
  std::vector<int> standby;
  for (int r : ready)
    if (std::find(members_.begin(), members_.end(), r) == members_.end()) standby.push_back(r);
  spdlog::info(
      "elastic: epoch {} formed: nodes {} (world size {}), workers meet at {}{}{}", epoch_,
      names(members_), n * cfg_.nproc_per_node, master_,
      standby.empty() ? "" : fmt::format("; standby {}", names(standby)),
      epoch_ > 1 ? fmt::format("; restarts {}/{}", restarts_used_, cfg_.max_restarts) : "");
  cv_.notify_all();
}

void ElasticRegistry::close_round(Closing how, const std::string& why, Clock::time_point now) {
  if (phase_ != Phase::kRunning) return;
  phase_ = Phase::kGathering;
  closing_ = how;
  gathering_since_ = now;
  if (how == Closing::kRestart) {
    ++restarts_used_;
    if (!failed_at_) failed_at_ = now;
    if (restarts_used_ > cfg_.max_restarts) {
      fail(fmt::format("{}: --max-restarts {} used up ({} failures); the newest checkpoint stays "
                       "for --resume latest",
                       why, cfg_.max_restarts, restarts_used_),
           false);
      return;
    }
  }
  spdlog::info("elastic: epoch {} ends: {} ({})", epoch_, why,
               how == Closing::kRestart
                   ? fmt::format("restart {}/{}; the workers resume from the newest checkpoint",
                                 restarts_used_, cfg_.max_restarts)
                   : std::string("the workers stop at the next step with a save"));
  cv_.notify_all();
}

void ElasticRegistry::agent_lost(Agent& a, const std::string& why, Clock::time_point now) {
  if (!a.alive) return;
  a.alive = false;
  a.waiting = false;
  a.left = why;
  const bool was_member = a.member && phase_ == Phase::kRunning;
  a.member = false;
  last_change_ = fmt::format("node {} left: {}", a.rank, why);
  spdlog::warn("elastic: {} left: {}", describe(a), why);
  if (was_member) close_round(Closing::kRestart, last_change_, now);
  if (phase_ == Phase::kStopping) stop_if_all_done();
  cv_.notify_all();
}

void ElasticRegistry::stop_if_all_done() {
  for (const auto& [rank, a] : agents_)
    if (a.alive && a.member && !a.done) return;
  phase_ = Phase::kStopped;
}

void ElasticRegistry::fail(const std::string& why, bool fatal) {
  if (over()) return;
  phase_ = Phase::kFailed;
  failure_ = why;
  fatal_ = fatal;
  spdlog::error("elastic: the job fails: {}", why);
  cv_.notify_all();
}

AgentReply ElasticRegistry::beat(int node_rank, const std::string& instance, int64_t epoch,
                                 WorkerEventKind event, const std::string& detail,
                                 Clock::time_point now, int64_t steps_lost) {
  std::lock_guard<std::mutex> lock(mu_);
  AgentReply r;
  r.epoch = epoch_;
  auto it = agents_.find(node_rank);
  if (it == agents_.end() || it->second.instance != instance || !it->second.alive) {
    r.action = AgentAction::kExit;
    r.failed = true;
    r.reason = fmt::format(
        "node {} is not (or no longer) a member of the job: it was dropped (silent for the "
        "heartbeat timeout, or replaced); restart it to join as a new node",
        node_rank);
    return r;
  }
  Agent& a = it->second;
  a.last_beat = now;
  r.peers = peers();
  const bool current = a.member && epoch == epoch_;
  switch (event) {
    case WorkerEventKind::kRunning:
      // A worker's restore after a failure (memory_snapshot.h): once per round, in the status.
      if (current && !detail.empty() && restore_epoch_ != epoch_) {
        restore_epoch_ = epoch_;
        last_change_ += (last_change_.empty() ? "" : "; ") + detail;
        if (steps_lost >= 0) {
          steps_lost_ = steps_lost;
          steps_lost_total_ += steps_lost;
        }
        spdlog::info("elastic: epoch {}: {}", epoch_, detail);
      }
      break;
    case WorkerEventKind::kFatal:
      fail(fmt::format("node {}'s worker refused the job: {}", node_rank, detail), true);
      break;
    case WorkerEventKind::kStopRequested:
      if (phase_ == Phase::kRunning || phase_ == Phase::kGathering) {
        phase_ = phase_ == Phase::kRunning ? Phase::kStopping : Phase::kStopped;
        last_change_ = fmt::format("node {} asked the job to stop ({})", node_rank, detail);
        spdlog::info("elastic: {}", last_change_);
      }
      break;
    case WorkerEventKind::kFinished:
      if (a.epoch == epoch_ && !over()) {
        phase_ = Phase::kFinished;
        spdlog::info("elastic: epoch {} trained the last step", epoch_);
      }
      break;
    case WorkerEventKind::kStopped:
      if (current && phase_ == Phase::kRunning) {
        // Stopped by a signal the agents did not see (sent to a worker): the job stops.
        phase_ = Phase::kStopping;
        last_change_ = fmt::format("node {}'s worker stopped on a signal", node_rank);
      }
      if (current && phase_ == Phase::kStopping) {
        a.done = true;
        stop_if_all_done();
      }
      break;
    case WorkerEventKind::kFailed:
      if (current && phase_ == Phase::kStopping) {
        a.done = true;  // a stopping job ends with what it has
        stop_if_all_done();
      }
      if (current && phase_ == Phase::kRunning) {
        last_change_ = fmt::format("node {}'s worker failed: {}", node_rank, detail);
        spdlog::warn("elastic: {}", last_change_);
        close_round(Closing::kRestart, last_change_, now);
      }
      break;
  }
  switch (phase_) {
    case Phase::kFinished:
      r.action = AgentAction::kExit;
      r.reason = "the job trained its last step";
      break;
    case Phase::kStopped:
      r.action = AgentAction::kExit;
      r.reason = "the job stopped on request";
      break;
    case Phase::kFailed:
      r.action = AgentAction::kExit;
      r.failed = true;
      r.fatal = fatal_;
      r.reason = failure_;
      break;
    case Phase::kStopping:
      r.action = a.member && !a.done ? AgentAction::kStop : AgentAction::kContinue;
      r.reason = "the job is stopping";
      break;
    case Phase::kGathering:
      if (a.member && !a.waiting) {
        r.action = closing_ == Closing::kRejoin ? AgentAction::kRejoin : AgentAction::kRestart;
        r.reason = last_change_;
      }
      break;
    case Phase::kRunning:
      break;
  }
  r.restarts_used = restarts_used_;
  cv_.notify_all();
  return r;
}

void ElasticRegistry::tick(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (over()) return;
  for (auto& [rank, a] : agents_) {
    if (a.alive && now - a.last_beat > cfg_.heartbeat_timeout) {
      agent_lost(a,
                 fmt::format("no heartbeat for {:.1f} s (heartbeat timeout {:.1f} s)",
                             seconds_between(a.last_beat, now),
                             std::chrono::duration<double>(cfg_.heartbeat_timeout).count()),
                 now);
    }
  }
  if (!over()) try_form(now);
}

ElasticView ElasticRegistry::view(Clock::time_point now) const {
  std::lock_guard<std::mutex> lock(mu_);
  ElasticView v;
  static const char* kNames[] = {"gathering", "running", "stopping",
                                 "finished",  "stopped", "failed"};
  v.phase = kNames[static_cast<int>(phase_)];
  v.epoch = epoch_;
  if (phase_ == Phase::kRunning || phase_ == Phase::kStopping) v.members = members_;
  for (const auto& [rank, a] : agents_)
    if (a.alive && (!a.member || a.waiting)) v.waiting.push_back(rank);
  v.restarts_used = restarts_used_;
  v.last_recovery_seconds = last_recovery_seconds_;
  v.since_last_recovery_seconds =
      last_recovered_at_ ? seconds_between(*last_recovered_at_, now) : -1.0;
  v.last_change = last_change_;
  v.failure = failure_;
  v.steps_lost = steps_lost_;
  v.steps_lost_total = steps_lost_total_;
  return v;
}

}  // namespace zerod
