// What each rank is doing, so that a failed or stalled collective can name the ranks that did
// not arrive (DESIGN.md section 4). Communicators report the start and end of every collective
// (cheap: memory writes); on a timeout or a peer failure they ask for a snapshot of all ranks.
// LocalPeerMonitor covers ranks that are threads of one process; the runtime's multi-node
// monitor (engine/runtime/) merges the local reports with what the master's heartbeats know.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace zerod {

struct RankProgress {
  int64_t started = 0;    // sequence number of the last collective this rank started (0: none)
  int64_t completed = 0;  // sequence number of the last collective it completed
  bool alive = true;
  std::string reason;  // why it is not alive ("killed", "rank thread failed: ...")
  // False: this process has no report of the rank's progress (a member of a sub-group's
  // communicator that runs in another process, see comm/group_monitor.h); started and completed
  // then mean nothing.
  bool known = true;
};

class PeerMonitor {
 public:
  virtual ~PeerMonitor() = default;
  // Called by the communicator of `rank` (no I/O; may be called from any thread).
  virtual void on_start(int rank, int64_t seq) = 0;
  virtual void on_complete(int rank, int64_t seq) = 0;
  // `rank` failed locally (its thread threw): peers should not wait for it.
  virtual void mark_dead(int rank, const std::string& reason) = 0;
  // The best current knowledge of every rank of the world (may do I/O; used on errors).
  virtual std::vector<RankProgress> snapshot() = 0;
};

// Ranks that are threads of one process: a shared table.
class LocalPeerMonitor : public PeerMonitor {
 public:
  explicit LocalPeerMonitor(int world_size) : ranks_(static_cast<size_t>(world_size)) {}
  void on_start(int rank, int64_t seq) override;
  void on_complete(int rank, int64_t seq) override;
  void mark_dead(int rank, const std::string& reason) override;
  std::vector<RankProgress> snapshot() override;

 private:
  std::mutex mu_;
  std::vector<RankProgress> ranks_;
};

// "rank 3 finished collective #180 but did not join #181; rank 5 is dead (killed)" for the
// ranks other than `self` that have not started collective `seq` or are dead; "" when every
// other rank is alive and has started it. Ranks whose progress is not known here are named as
// such ("rank 6 runs in another process: its progress is not known here"). `names`: the rank
// printed for each index of `ranks` (a sub-group's global ranks); empty: the index itself.
std::string describe_missing_ranks(const std::vector<RankProgress>& ranks, int64_t seq, int self,
                                   const std::vector<int>& names = {});

}  // namespace zerod
