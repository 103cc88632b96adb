// The ParamSource side of ZeRO stage 3 (DESIGN.md section 3): each rank keeps only its shard of
// every unit's compute weights; a unit is all-gathered into a pooled buffer right before use
// (forward, and again in backward), released after, and the next unit is prefetched
// asynchronously while this one computes. Units at most stage3_param_persistence_threshold
// elements stay gathered for good; prefetching keeps the gathered elements within
// stage3_max_live_parameters (a unit that must be used now is always gathered).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "comm/communicator.h"
#include "kernels/backend.h"
#include "model/param_source.h"
#include "zero/buffer_pool.h"
#include "zero/partition.h"

namespace zerod {

struct GathererOptions {
  Communicator* comm = nullptr;
  // The experts units' group (UnitPartition::experts; required when the partition has them).
  Communicator* expert_comm = nullptr;
  // Where unit u's shard is: given the place the gather wants it (this rank's part of the
  // gathered buffer), returns a pointer to it, having copied it there if it had to be loaded
  // (parameters offloaded to NVMe). Null: every shard is in `shards`.
  std::function<const void*(int unit, void* in_place)> shard_of;
  int64_t prefetch_bucket_size = 50000000;
  int64_t param_persistence_threshold = 100000;
  int64_t max_live_parameters = 1000000000;
};

class ParamGatherer : public ParamSource {
 public:
  // `shards`: every unit's weight shard back to back (Partition::shard_offset), compute dtype.
  ParamGatherer(const Partition& partition, Backend& backend, const GathererOptions& options,
                void* shards, MemoryTracker* tracker);
  ~ParamGatherer() override;

  const void* acquire(int unit) override;
  void release(int unit) override;
  void prefetch(int unit) override;
  // The shards changed (optimizer step): drops gathered copies nobody holds (prefetches that
  // were not used) and re-gathers the persistent units.
  void shards_changed();

  bool persistent(int unit) const { return slots_.at(static_cast<size_t>(unit)).persistent; }
  int64_t live_elements() const { return live_; }
  double wait_seconds() const { return wait_seconds_; }

 private:
  struct Slot {
    Buffer buffer;  // gathered weights (padded unit), empty when not gathered
    WorkPtr work;   // the gather in flight
    int refs = 0;
    bool persistent = false;
  };
  void start_gather(int unit);
  Communicator& comm_of(int unit) const {
    return *(part_.unit(unit).experts ? opt_.expert_comm : opt_.comm);
  }
  void finish_gather(Slot& s);

  const Partition& part_;
  Backend& be_;
  GathererOptions opt_;
  char* shards_;
  size_t esz_;
  BufferPool pool_;
  MemoryTracker* tracker_;
  std::vector<Slot> slots_;
  int64_t live_ = 0;  // gathered elements of non-persistent units
  double wait_seconds_ = 0;
};

}  // namespace zerod
