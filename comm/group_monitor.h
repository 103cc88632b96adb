// The PeerMonitor of a sub-group's communicator (comm/process_groups.h), over the world's.
//
// A sub-group's communicator numbers its own collectives and its ranks 0..n-1, so it cannot
// report into the world's monitor, whose table is by global rank and world sequence number.
// GroupPeerMonitor keeps the group's progress (by group rank, group sequence number) in a table
// shared by every member of the group that runs in this process (ranks that are threads of one
// process each make their own GroupPeerMonitor; those of one group find the same table through
// the world monitor and the group's key). Liveness comes from the world's monitor: snapshot()
// reads it at the members' global ranks, so a rank whose thread failed, or a node the master
// lost, is dead in every group it belongs to; mark_dead() marks the global rank in the world's.
//
// Members that run in other processes never report here: snapshot() gives them known = false
// (describe_missing_ranks then says their progress is not known here), unless the world's
// monitor knows them dead.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/peer_monitor.h"

namespace zerod {

class GroupPeerMonitor : public PeerMonitor {
 public:
  // `world`: the world's monitor (not null). `key`: the group's key, unique in the job (the same
  // on every member). `global_ranks`: the members, by group rank; `self`: this rank's index.
  GroupPeerMonitor(std::shared_ptr<PeerMonitor> world, const std::string& key,
                   std::vector<int> global_ranks, int self);
  ~GroupPeerMonitor() override;

  void on_start(int rank, int64_t seq) override;
  void on_complete(int rank, int64_t seq) override;
  void mark_dead(int rank, const std::string& reason) override;
  // By group rank.
  std::vector<RankProgress> snapshot() override;

  const std::vector<int>& global_ranks() const { return global_ranks_; }

  struct Table;  // the group's progress, shared by its members in this process (internal)

 private:
  const std::shared_ptr<PeerMonitor> world_;
  const std::vector<int> global_ranks_;
  const int self_;
  std::shared_ptr<Table> table_;
};

}  // namespace zerod
