#include "engine/runtime/world_monitor.h"

#include <algorithm>

#include "core/error.h"

namespace zerod {

WorldMonitor::WorldMonitor(int world_size, int first_local_rank, int local_count)
    : world_size_(world_size), first_local_(first_local_rank), count_(local_count) {
  ZD_CHECK(world_size >= 1 && local_count >= 1 && first_local_rank >= 0 &&
               first_local_rank + local_count <= world_size,
           "local ranks [{}, {}) in a world of {}", first_local_rank,
           first_local_rank + local_count, world_size);
  ranks_.resize(static_cast<size_t>(world_size));
}

void WorldMonitor::check_rank(int rank, const char* what) const {
  ZD_CHECK(rank >= 0 && rank < world_size_, "{}: rank {} outside the world of {}", what, rank,
           world_size_);
}

void WorldMonitor::on_start(int rank, int64_t seq) {
  check_rank(rank, "on_start");
  std::lock_guard<std::mutex> lock(mu_);
  auto& r = ranks_[static_cast<size_t>(rank)];
  r.started = std::max(r.started, seq);
}

void WorldMonitor::on_complete(int rank, int64_t seq) {
  check_rank(rank, "on_complete");
  std::lock_guard<std::mutex> lock(mu_);
  auto& r = ranks_[static_cast<size_t>(rank)];
  r.completed = std::max(r.completed, seq);
  r.started = std::max(r.started, seq);
}

void WorldMonitor::mark_dead(int rank, const std::string& reason) {
  check_rank(rank, "mark_dead");
  std::lock_guard<std::mutex> lock(mu_);
  auto& r = ranks_[static_cast<size_t>(rank)];
  if (!r.alive) return;  // the first reason is the one that matters
  r.alive = false;
  r.reason = reason;
}

std::vector<RankProgress> WorldMonitor::snapshot() {
  std::lock_guard<std::mutex> lock(mu_);
  return ranks_;
}

std::vector<RankProgress> WorldMonitor::local_progress() {
  std::lock_guard<std::mutex> lock(mu_);
  return {ranks_.begin() + first_local_, ranks_.begin() + first_local_ + count_};
}

void WorldMonitor::update_remote(int rank, const RankProgress& progress) {
  if (rank < 0 || rank >= world_size_ || is_local(rank)) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto& r = ranks_[static_cast<size_t>(rank)];
  if (!r.alive && progress.alive) {  // a death is final: keep it and its reason
    r.started = std::max(r.started, progress.started);
    r.completed = std::max(r.completed, progress.completed);
    return;
  }
  r = progress;
}

void WorldMonitor::mark_remote_dead(int first, int count, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int rank = std::max(first, 0); rank < std::min(first + count, world_size_); ++rank) {
    if (is_local(rank)) continue;
    auto& r = ranks_[static_cast<size_t>(rank)];
    if (!r.alive) continue;
    r.alive = false;
    r.reason = reason;
  }
}

}  // namespace zerod
