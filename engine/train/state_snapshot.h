// Copy-on-update snapshot of a rank's optimizer states for an async checkpoint.
//
// An async save does not copy anything up front: its writer thread writes the live fp32 master
// weights and Adam moments unit by unit, while forward and backward (which never change them)
// go on. Only when the next optimizer step is about to update a unit that the writer has not
// reached yet is that unit copied to host memory, and the writer takes the copy. A unit the
// writer is writing at that moment is waited for. Training is blocked only for those copies and
// waits; when steps take longer than the write, not at all. The copy buffers are allocated the
// first time a unit needs one and kept for later saves.
#pragma once

#include <condition_variable>
#include <mutex>
#include <vector>

#include "core/memory.h"
#include "engine/checkpoint/shard_io.h"
#include "zero/update_guard.h"

namespace zerod {

class StateSnapshot : public UpdateGuard, public ShardSource {
 public:
  StateSnapshot(int num_units, MemoryTracker* tracker);

  // A save starts: `shards` point at the live states (at most one shard per unit).
  void begin(const std::vector<ShardData>& shards);
  // The writer stopped early (an error): nothing is being written any more.
  void abandon();

  // UpdateGuard (the training thread)
  void before_update(int unit) override;
  // ShardSource (the writer thread)
  ShardData acquire(size_t i) override;
  void release(size_t i) override;

  // Training time spent in before_update copying or waiting, since construction.
  double blocked_seconds() const;
  int64_t copied_bytes() const;  // since construction

 private:
  enum class State { kLive, kWriting, kCopied, kDone };
  struct Copy {
    Buffer master, exp_avg, exp_avg_sq;
  };

  MemoryTracker* tracker_;
  std::vector<int> shard_of_unit_;  // -1: this rank holds nothing of the unit
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<ShardData> shards_;
  std::vector<State> state_;
  std::vector<Copy> copies_;  // by unit, kept from one save to the next
  bool active_ = false;
  double blocked_ = 0;
  int64_t copied_ = 0;
};

}  // namespace zerod
