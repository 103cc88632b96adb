// The membership of an elastic job (zerod train --nnodes MIN:MAX, docs/elastic.md): which
// agents are registered and alive, which round (membership epoch) runs, what each agent must
// do with its worker. Pure logic under one mutex, no gRPC: the ElasticRendezvous service
// (engine/runtime/grpc/elastic_service.h) calls it, and its unit tests drive it with a clock of
// their own.
//
// Phases: gathering (no round runs; the next forms when every live agent has rejoined, and in
// the first round after the settle time) -> running (round `epoch`) -> gathering again when a
// member fails (restart) or a waiting agent can join (the members stop at the next step with a
// save), or stopping (SIGTERM) -> over (finished, stopped or failed).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/timer.h"

namespace zerod {

struct ElasticConfig {
  std::string job_hash;
  int nproc_per_node = 1;
  int min_nodes = 1, max_nodes = 1;
  // Node counts in [min_nodes, max_nodes] whose world size can train the job (ascending).
  std::vector<int> admissible;
  std::chrono::milliseconds settle{5000};
  std::chrono::milliseconds heartbeat_timeout{2000};
  // How long a gathering with fewer live agents than the smallest admissible count may last
  // (after the first round) before the job fails.
  std::chrono::milliseconds below_min_timeout{300000};
  int max_restarts = 3;
  std::string master_host;  // for messages
  // The instance of the agent hosting this registry: not its own successor (peers()).
  std::string host_instance;
};

// A live agent as the others see it: the successors of a lost rendezvous host, in node-rank
// order (docs/elastic.md, "Node 0 dies").
struct ElasticPeer {
  int node_rank = -1;
  std::string instance, hostname, address;
};

// What the agent taking the rendezvous over knew from the lost host's last reply: the new
// registry starts gathering after a failure (the lost host's), expecting these agents back.
struct ElasticTakeover {
  int64_t epoch = 0;
  int restarts_used = 0;
  int64_t steps_lost_total = 0;
  std::vector<ElasticPeer> agents;  // the live agents but the lost host
  int lost_rank = -1;
  std::string lost_instance, why;
  double silent_seconds = 0;  // since the lost host last renewed its lease: the recovery's start
};

// A refused registration (a bad joiner): the message says why.
class ElasticRefusal : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ElasticJoin {
  std::string job_hash;
  int node_rank = -1;  // -1: assign
  int nproc_per_node = 1;
  int min_nodes = 1, max_nodes = 1;
  std::string hostname, address;
  int port = 0;
  int64_t epoch = 0;  // the last epoch this agent ran in
  std::string instance;
};

struct ElasticRound {
  bool formed = false;
  std::string reason;  // not formed: why (waiting for whom), or the job is over
  bool over = false;   // the job is over (failed or finished): stop asking
  int node_rank = -1;
  int64_t epoch = 0;
  int round_rank = -1;
  std::vector<int> members;  // node ranks by round rank
  std::string master;        // HOST:PORT of the round's worker rendezvous
  int restarts_used = 0, max_restarts = 0;
  double last_recovery_seconds = 0;
  std::vector<ElasticPeer> peers;  // who takes the rendezvous over, in order
  int64_t steps_lost_total = 0;
};

enum class WorkerEventKind { kRunning, kFailed, kStopped, kFinished, kStopRequested, kFatal };
enum class AgentAction { kContinue, kRestart, kRejoin, kStop, kExit };

struct AgentReply {
  AgentAction action = AgentAction::kContinue;
  std::string reason;
  int64_t epoch = 0;
  bool failed = false, fatal = false;
  int restarts_used = 0;
  std::vector<ElasticPeer> peers;  // who takes the rendezvous over, in order
};

struct ElasticView {
  std::string phase;  // gathering, running, stopping, finished, stopped, failed
  int64_t epoch = 0;
  std::vector<int> members, waiting;
  int restarts_used = 0;
  double last_recovery_seconds = 0;
  double since_last_recovery_seconds = -1;
  std::string last_change, failure;
  int64_t steps_lost = -1, steps_lost_total = 0;
};

class ElasticRegistry {
 public:
  explicit ElasticRegistry(ElasticConfig config);
  // A registry taking over from a lost host: gathering after a failure at `t.epoch`, the
  // restart counted (the job fails when that uses up --max-restarts).
  ElasticRegistry(ElasticConfig config, const ElasticTakeover& t);

  // Registers (or re-registers) an agent and returns at once: formed when a round including it
  // runs now. Throws ElasticRefusal for a bad joiner.
  ElasticRound join(const ElasticJoin& req, Clock::time_point now);
  // join(), then waits until a round includes it, the job is over, or `deadline`.
  ElasticRound join_and_wait(const ElasticJoin& req, Clock::time_point deadline);
  // `steps_lost` >= 0 with a worker's restore in `detail`: the steps that failure lost.
  AgentReply beat(int node_rank, const std::string& instance, int64_t epoch, WorkerEventKind event,
                  const std::string& detail, Clock::time_point now, int64_t steps_lost = -1);
  // Silent agents, formation deadlines, the below-MIN timeout.
  void tick(Clock::time_point now);
  ElasticView view(Clock::time_point now) const;
  const ElasticConfig& config() const { return cfg_; }
  // Ends the job as failed (a host that was taken over: docs/elastic.md).
  void abandon(const std::string& why);

 private:
  enum class Phase { kGathering, kRunning, kStopping, kFinished, kStopped, kFailed };
  enum class Closing { kNone, kRestart, kRejoin };
  struct Agent {
    int rank = -1;
    std::string instance, hostname, address;
    int port = 0;
    Clock::time_point last_beat;
    bool alive = true;
    bool waiting = false;  // registered for the next round (its worker is down)
    bool member = false;   // in the current round
    bool done = false;     // its worker stopped or finished in the stopping phase
    int64_t epoch = 0;     // the last round it was in
    std::string left;      // why it was dropped
  };

  ElasticRound round_for(const Agent& a) const;
  void validate(const ElasticJoin& req) const;
  int assign_rank() const;
  void try_form(Clock::time_point now);
  void close_round(Closing how, const std::string& why, Clock::time_point now);
  void agent_lost(Agent& a, const std::string& why, Clock::time_point now);
  void fail(const std::string& why, bool fatal);
  // Stopping: every live member's worker stopped -> stopped.
  void stop_if_all_done();
  bool over() const;
  std::string describe(const Agent& a) const;
  std::string names(const std::vector<int>& ranks) const;
  int largest_admissible(int count) const;
  std::vector<ElasticPeer> peers() const;

  const ElasticConfig cfg_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<int, Agent> agents_;
  Phase phase_ = Phase::kGathering;
  Closing closing_ = Closing::kNone;  // why the last round closed (gathering after a round)
  int64_t epoch_ = 0;
  std::vector<int> members_;
  std::string master_;
  std::optional<Clock::time_point> min_reached_;  // first round: MIN live agents since
  Clock::time_point gathering_since_;
  std::optional<Clock::time_point> failed_at_;  // the failure the next round recovers from
  int restarts_used_ = 0;
  double last_recovery_seconds_ = 0;
  int64_t restore_epoch_ = 0;  // the round whose restore last_change_ reports
  int64_t steps_lost_ = -1, steps_lost_total_ = 0;
  std::optional<Clock::time_point> last_recovered_at_;
  std::string last_change_, failure_;
  bool fatal_ = false;
};

}  // namespace zerod
