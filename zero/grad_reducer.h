// The GradSink side of ZeRO: where backward writes each unit's gradients and how they are
// reduced across ranks (DESIGN.md section 3).
//
//   stage 0  full gradients, accumulated over micro-batches; on the last micro-batch of a step
//            all-reduced in buckets of reduce_bucket_size elements as units finish
//   stage 1  full gradients, accumulated; on the last micro-batch each unit is reduce-scattered
//            in place as it finishes, so its owner holds the sum of its shard
//   stage 2/3 only this rank's gradient shard is kept: every micro-batch each finished unit is
//            written into a scratch bucket, reduce-scattered, and added into the shard
//
// Reductions run on the communicator's thread; with overlap_comm they are waited for only at
// finish() (or when the stage-2/3 buckets in flight exceed reduce_bucket_size), otherwise at
// once. Reduced gradients are sums over ranks (the optimizer divides by the world size).
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "comm/communicator.h"
#include "core/memory.h"
#include "kernels/backend.h"
#include "model/param_source.h"
#include "zero/buffer_pool.h"
#include "zero/grad_compression.h"
#include "zero/partition.h"

namespace zerod {

struct ReducerOptions {
  int stage = 0;
  int rank = 0;
  Communicator* comm = nullptr;  // null or size 1: nothing to reduce
  // The experts units' group (UnitPartition::experts) and this rank's index in it (required when
  // the partition has experts units).
  int expert_rank = 0;
  Communicator* expert_comm = nullptr;
  int64_t reduce_bucket_size = 500000000;
  bool overlap_comm = false;
  // Stage 0: a compression hook that may take over a step's reduction (not owned; null: none).
  GradCompression* compression = nullptr;
};

class GradReducer : public GradSink {
 public:
  // `partition` is the optimizer partition (world 1 at stage 0, the world otherwise).
  GradReducer(const Partition& partition, Backend& backend, const ReducerOptions& options,
              MemoryTracker* tracker);
  ~GradReducer() override;

  // Start of an accumulation window: gradients are zero.
  void zero_grad();
  // Before each micro-batch's backward; `last`: the step's last micro-batch.
  void begin_micro_batch(bool last);
  void* grad_buffer(int unit) override;
  void unit_done(int unit) override;
  // Waits for every reduction of the step. After it, shard(u) holds the summed gradients.
  void finish();

  // Stage 0: whether the step's gradients are all-reduced (default); off, each rank keeps its
  // own (the 1-bit optimizers past their warm-up, zero/onebit.h). Set before the step's last
  // micro-batch.
  void set_reduce(bool on) { reduce_ = on; }
  bool reduces() const { return reduce_ || opt_.stage != 0; }

  // This rank's reduced gradient shard of unit u (partition.unit(u).shard elements).
  void* shard(int unit);
  double wait_seconds() const { return wait_seconds_; }

 private:
  struct Pending {
    WorkPtr work;
    int unit = -1;
    Buffer scratch;  // stage 2/3: the unit's full gradients (sent)
    Buffer partial;  // stage 2/3, not the first micro-batch: the received shard, added at retire
  };
  bool distributed() const { return comm_ != nullptr && comm_->size() > 1; }
  // Unit u's group and this rank's index in it.
  Communicator* comm_of(int u) const { return part_.unit(u).experts ? opt_.expert_comm : comm_; }
  int rank_of(int u) const { return part_.unit(u).experts ? opt_.expert_rank : opt_.rank; }
  bool distributed(int u) const { return comm_of(u) != nullptr && comm_of(u)->size() > 1; }
  bool sharded_grads() const { return opt_.stage >= 2; }
  void launch_bucket();
  void retire_oldest();
  void wait(const WorkPtr& w);

  const Partition& part_;
  Backend& be_;
  ReducerOptions opt_;
  Communicator* comm_;
  size_t esz_;
  CommType ctype_;
  Buffer full_;   // stages 0-1: every unit's padded gradients back to back
  Buffer shard_;  // stages 2-3: every unit's gradient shard back to back
  BufferPool pool_;
  std::vector<Buffer> scratch_;  // stages 2-3: the unit's gradient bucket while backward writes it
  std::deque<Pending> pending_;
  int64_t in_flight_elems_ = 0;
  bool last_micro_ = true;
  bool compress_ = false;  // this step's reduction is opt_.compression's (at finish())
  bool compress_decided_ = false;  // compress_ is set for this step (at its first last micro-batch)
  int64_t micro_index_ = 0;
  // stage 0: the bucket being filled (units finish in decreasing order)
  int bucket_lo_ = -1, bucket_hi_ = -1;
  int64_t bucket_elems_ = 0;
  double wait_seconds_ = 0;
  bool reduce_ = true;
};

}  // namespace zerod
