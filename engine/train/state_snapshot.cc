#include "engine/train/state_snapshot.h"

#include <cstring>

#include "core/error.h"
#include "core/timer.h"

namespace zerod {

StateSnapshot::StateSnapshot(int num_units, MemoryTracker* tracker)
    : tracker_(tracker),
      shard_of_unit_(static_cast<size_t>(num_units), -1),
      copies_(static_cast<size_t>(num_units)) {}

void StateSnapshot::begin(const std::vector<ShardData>& shards) {
  std::lock_guard<std::mutex> lock(mu_);
  ZD_CHECK(!active_, "a save began while the previous one was still being written");
  std::fill(shard_of_unit_.begin(), shard_of_unit_.end(), -1);
  for (size_t i = 0; i < shards.size(); ++i) {
    const int u = shards[i].unit;
    ZD_CHECK(u >= 0 && u < static_cast<int>(shard_of_unit_.size()) && shard_of_unit_[u] < 0,
             "snapshot: unit {} twice or out of range", u);
    shard_of_unit_[static_cast<size_t>(u)] = static_cast<int>(i);
  }
  shards_ = shards;
  state_.assign(shards.size(), State::kLive);
  active_ = !shards.empty();
}

void StateSnapshot::abandon() {
  std::lock_guard<std::mutex> lock(mu_);
  std::fill(state_.begin(), state_.end(), State::kDone);
  active_ = false;
  cv_.notify_all();
}

void StateSnapshot::before_update(int unit) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!active_) return;
  const int i = shard_of_unit_[static_cast<size_t>(unit)];
  if (i < 0) return;
  State& st = state_[static_cast<size_t>(i)];
  if (st == State::kDone || st == State::kCopied) return;
  Stopwatch sw;
  if (st == State::kWriting) {
    cv_.wait(lock, [&] { return st == State::kDone; });
  } else {  // kLive: the writer has not reached it; it will write this copy instead
    ShardData& s = shards_[static_cast<size_t>(i)];
    const size_t bytes = static_cast<size_t>(s.end - s.begin) * sizeof(float);
    Copy& c = copies_[static_cast<size_t>(unit)];
    const float* src[3] = {s.master, s.exp_avg, s.exp_avg_sq};
    Buffer* dst[3] = {&c.master, &c.exp_avg, &c.exp_avg_sq};
    const float** ptr[3] = {&s.master, &s.exp_avg, &s.exp_avg_sq};
    for (int k = 0; k < 3; ++k) {
      if (dst[k]->bytes() != bytes) *dst[k] = host_alloc(bytes, MemCategory::kCheckpoint, tracker_);
      std::memcpy(dst[k]->data(), src[k], bytes);
      *ptr[k] = dst[k]->as<float>();
    }
    copied_ += static_cast<int64_t>(3 * bytes);
    st = State::kCopied;
  }
  blocked_ += sw.seconds();
}

ShardData StateSnapshot::acquire(size_t i) {
  std::lock_guard<std::mutex> lock(mu_);
  ZD_CHECK(i < state_.size(), "snapshot: shard {} of {}", i, state_.size());
  if (state_[i] == State::kLive) state_[i] = State::kWriting;
  return shards_[i];  // live pointers, or the copy's
}

void StateSnapshot::release(size_t i) {
  std::lock_guard<std::mutex> lock(mu_);
  state_[i] = State::kDone;
  if (i + 1 == state_.size()) active_ = false;
  cv_.notify_all();
}

double StateSnapshot::blocked_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return blocked_;
}

int64_t StateSnapshot::copied_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return copied_;
}

}  // namespace zerod
