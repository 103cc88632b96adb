#include "comm/group_monitor.h"

#include <map>
#include <mutex>
#include <utility>

#include "core/error.h"

namespace zerod {

// One group's progress, shared by its members in this process.
struct GroupPeerMonitor::Table {
  explicit Table(size_t n) : ranks(n), local(n, false) {}
  std::mutex mu;
  std::vector<RankProgress> ranks;  // started / completed by group rank
  std::vector<bool> local;          // a member of this process made a monitor for it
};

namespace {

// The tables of the groups alive in this process, by (world monitor, key). An entry lives as
// long as a GroupPeerMonitor holds its table; each monitor also holds the world monitor, so a
// world monitor's address is not reused while an entry for it lives.
struct Registry {
  std::mutex mu;
  std::map<std::pair<const PeerMonitor*, std::string>, std::weak_ptr<GroupPeerMonitor::Table>>
      tables;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: monitors may outlive static teardown
  return *r;
}

}  // namespace

GroupPeerMonitor::GroupPeerMonitor(std::shared_ptr<PeerMonitor> world, const std::string& key,
                                   std::vector<int> global_ranks, int self)
    : world_(std::move(world)), global_ranks_(std::move(global_ranks)), self_(self) {
  ZD_CHECK(world_ != nullptr, "the monitor of group '{}' needs the world's monitor", key);
  ZD_CHECK(self_ >= 0 && static_cast<size_t>(self_) < global_ranks_.size(),
           "rank index {} outside group '{}' of {} ranks", self_, key, global_ranks_.size());
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (auto it = r.tables.begin(); it != r.tables.end();) {
    it = it->second.expired() ? r.tables.erase(it) : std::next(it);
  }
  auto& slot = r.tables[{world_.get(), key}];
  table_ = slot.lock();
  if (!table_) {
    table_ = std::make_shared<Table>(global_ranks_.size());
    slot = table_;
  }
  ZD_CHECK(table_->ranks.size() == global_ranks_.size(),
           "group key '{}' is used by groups of {} and {} ranks", key, table_->ranks.size(),
           global_ranks_.size());
  std::lock_guard<std::mutex> table_lock(table_->mu);
  table_->local[static_cast<size_t>(self_)] = true;
}

GroupPeerMonitor::~GroupPeerMonitor() = default;

void GroupPeerMonitor::on_start(int rank, int64_t seq) {
  std::lock_guard<std::mutex> lock(table_->mu);
  ZD_CHECK(rank >= 0 && static_cast<size_t>(rank) < table_->ranks.size(),
           "rank {} outside a group of {}", rank, table_->ranks.size());
  table_->ranks[static_cast<size_t>(rank)].started = seq;
}

void GroupPeerMonitor::on_complete(int rank, int64_t seq) {
  std::lock_guard<std::mutex> lock(table_->mu);
  ZD_CHECK(rank >= 0 && static_cast<size_t>(rank) < table_->ranks.size(),
           "rank {} outside a group of {}", rank, table_->ranks.size());
  table_->ranks[static_cast<size_t>(rank)].completed = seq;
}

void GroupPeerMonitor::mark_dead(int rank, const std::string& reason) {
  ZD_CHECK(rank >= 0 && static_cast<size_t>(rank) < global_ranks_.size(),
           "rank {} outside a group of {}", rank, global_ranks_.size());
  world_->mark_dead(global_ranks_[static_cast<size_t>(rank)], reason);
}

std::vector<RankProgress> GroupPeerMonitor::snapshot() {
  const std::vector<RankProgress> world = world_->snapshot();  // may do I/O: outside our lock
  std::vector<RankProgress> out;
  {
    std::lock_guard<std::mutex> lock(table_->mu);
    out = table_->ranks;
    for (size_t i = 0; i < out.size(); ++i) out[i].known = table_->local[i];
  }
  for (size_t i = 0; i < out.size(); ++i) {
    const auto g = static_cast<size_t>(global_ranks_[i]);
    if (g < world.size() && !world[g].alive) {
      out[i].alive = false;
      out[i].reason = world[g].reason;
    }
  }
  return out;
}

}  // namespace zerod
