// The PeerMonitor of one node of a multi-node job: this node's ranks report their collectives
// here (memory writes only); the node's heartbeat carries them to the master, whose replies
// (every rank of the world) are fed back with update_remote(). snapshot() merges both: this
// node's ranks as they stand now, the others as the master last saw them.
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include "comm/peer_monitor.h"

namespace zerod {

class WorldMonitor : public PeerMonitor {
 public:
  // This node runs global ranks [first_local_rank, first_local_rank + local_count).
  WorldMonitor(int world_size, int first_local_rank, int local_count);

  void on_start(int rank, int64_t seq) override;
  void on_complete(int rank, int64_t seq) override;
  void mark_dead(int rank, const std::string& reason) override;
  std::vector<RankProgress> snapshot() override;

  int world_size() const { return world_size_; }
  int first_local_rank() const { return first_local_; }
  bool is_local(int rank) const { return rank >= first_local_ && rank < first_local_ + count_; }

  // This node's ranks, in rank order (what the heartbeat sends).
  std::vector<RankProgress> local_progress();
  // The master's view of `rank` (ignored for this node's own ranks: local knowledge is newer).
  void update_remote(int rank, const RankProgress& progress);
  // Ranks [first, first + count) are reported dead with `reason` unless already dead (the
  // master's ranks once the master cannot be reached).
  void mark_remote_dead(int first, int count, const std::string& reason);

 private:
  void check_rank(int rank, const char* what) const;

  const int world_size_;
  const int first_local_;
  const int count_;
  std::mutex mu_;
  std::vector<RankProgress> ranks_;  // by global rank
};

}  // namespace zerod
