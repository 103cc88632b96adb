#include "zero/grad_reducer.h"

#include "core/error.h"
#include "core/timer.h"
#include "zero/compute_comm.h"

namespace zerod {

namespace {
char* at(void* base, int64_t elems, size_t esz) {
  return static_cast<char*>(base) + elems * static_cast<int64_t>(esz);
}
}  // namespace

GradReducer::GradReducer(const Partition& partition, Backend& backend,
                         const ReducerOptions& options, MemoryTracker* tracker)
    : part_(partition),
      be_(backend),
      opt_(options),
      comm_(options.comm),
      esz_(backend.compute_elem_size()),
      ctype_(compute_comm_type(backend)),
      pool_(backend, MemCategory::kBuckets, tracker),
      scratch_(static_cast<size_t>(partition.num_units())) {
  for (int u = 0; u < part_.num_units(); ++u)
    ZD_CHECK(!part_.unit(u).experts || opt_.expert_comm != nullptr,
             "unit {} is split over the experts' group, which has no communicator", u);
  if (sharded_grads()) {
    shard_ = be_.allocate(static_cast<size_t>(part_.shard_elems_total()) * esz_,
                          MemCategory::kGradients, tracker);
  } else {
    full_ = be_.allocate(static_cast<size_t>(part_.padded_elems_total()) * esz_,
                         MemCategory::kGradients, tracker);
  }
}

GradReducer::~GradReducer() {
  // Outstanding collectives reference our buffers: let them finish (or fail) first.
  for (auto& p : pending_) {
    try {
      if (p.work) p.work->wait();
    } catch (...) {
    }
  }
}

void GradReducer::zero_grad() {
  ZD_CHECK(pending_.empty(), "zero_grad with {} reductions in flight", pending_.size());
  if (sharded_grads()) {
    be_.memset_zero(shard_.data(), shard_.bytes());
  } else {
    be_.memset_zero(full_.data(), full_.bytes());
  }
  micro_index_ = -1;
}

void GradReducer::begin_micro_batch(bool last) {
  launch_bucket();  // (a bucket the last micro-batch left unfilled: pipeline stages, see unit_done)
  last_micro_ = last;
  // Once per step: an interleaved pipeline rank begins the last micro-batch once per chunk, and
  // between them earlier micro-batches of other chunks (the hook's step count moves once).
  if (last && !compress_decided_) {
    compress_ = opt_.stage == 0 && distributed() && opt_.compression != nullptr &&
                opt_.compression->begin_step();
    compress_decided_ = true;
  }
  ++micro_index_;
  bucket_lo_ = bucket_hi_ = -1;
  bucket_elems_ = 0;
}

void* GradReducer::grad_buffer(int unit) {
  if (!sharded_grads()) return at(full_.data(), part_.padded_offset(unit), esz_);
  Buffer& s = scratch_[static_cast<size_t>(unit)];
  if (s.empty()) s = pool_.take(static_cast<size_t>(part_.unit(unit).padded) * esz_, true);
  return s.data();
}

void* GradReducer::shard(int unit) {
  if (sharded_grads()) return at(shard_.data(), part_.shard_offset(unit), esz_);
  return at(full_.data(), part_.padded_offset(unit) + part_.unit(unit).begin(rank_of(unit)), esz_);
}

void GradReducer::wait(const WorkPtr& w) {
  Stopwatch sw;
  w->wait();
  wait_seconds_ += sw.seconds();
}

void GradReducer::launch_bucket() {
  if (bucket_lo_ < 0) return;
  const int64_t begin = part_.padded_offset(bucket_lo_);
  const int64_t end = part_.padded_offset(bucket_hi_) + part_.unit(bucket_hi_).padded;
  Pending p;
  p.work =
      comm_of(bucket_lo_)
          ->all_reduce_async(at(full_.data(), begin, esz_), end - begin, ctype_, ReduceOp::kSum);
  p.unit = bucket_lo_;
  pending_.push_back(std::move(p));
  bucket_lo_ = bucket_hi_ = -1;
  bucket_elems_ = 0;
  if (!opt_.overlap_comm) retire_oldest();
}

void GradReducer::unit_done(int unit) {
  const UnitPartition& up = part_.unit(unit);
  if (!sharded_grads()) {
    // (Accumulated locally until the end; an experts unit alone on its experts: kept.)
    if (!last_micro_ || !distributed(unit) || !reduces()) return;
    if (opt_.stage == 0) {
      if (compress_) return;  // the whole buffer goes to the compression hook at finish()
      // A bucket is one contiguous range of units of one group, which finish in decreasing
      // order; a unit that does not extend it (a pipeline stage's tied embedding copy, unit 0,
      // right after its final unit; an interleaved rank's next chunk; a unit of the other group)
      // sends the bucket off and starts another.
      if (bucket_lo_ >= 0 &&
          (unit != bucket_lo_ - 1 || part_.unit(unit).experts != part_.unit(bucket_lo_).experts))
        launch_bucket();
      if (bucket_hi_ < 0) bucket_hi_ = unit;
      bucket_lo_ = unit;
      bucket_elems_ += up.padded;
      if (bucket_elems_ >= opt_.reduce_bucket_size || unit == 0) launch_bucket();
      return;
    }
    // Stage 1: reduce-scatter the unit in place; the owner's shard receives the sum.
    char* base = at(full_.data(), part_.padded_offset(unit), esz_);
    Pending p;
    p.work = comm_of(unit)->reduce_scatter_async(base, at(base, up.begin(rank_of(unit)), esz_),
                                                 up.shard, ctype_, ReduceOp::kSum);
    p.unit = unit;
    pending_.push_back(std::move(p));
    if (!opt_.overlap_comm) retire_oldest();
    return;
  }
  // Stages 2-3: reduce-scatter the unit's bucket and add it into the shard.
  Pending p;
  p.unit = unit;
  p.scratch = std::move(scratch_[static_cast<size_t>(unit)]);
  ZD_CHECK(!p.scratch.empty(), "unit {} finished without gradients", unit);
  void* dst = shard(unit);
  if (!distributed(unit)) {
    // One rank: the shard is the whole unit; accumulate it directly.
    if (micro_index_ == 0) {
      be_.copy(dst, p.scratch.data(), static_cast<size_t>(up.shard) * esz_);
    } else {
      be_.residual_forward(dst, dst, p.scratch.data(), up.shard);  // dst += scratch
      be_.round_to_compute(dst, up.shard);
    }
    pool_.give(std::move(p.scratch));
    return;
  }
  void* recv = dst;
  if (micro_index_ > 0) {
    p.partial = pool_.take(static_cast<size_t>(up.shard) * esz_, false);
    recv = p.partial.data();
  }
  p.work =
      comm_of(unit)->reduce_scatter_async(p.scratch.data(), recv, up.shard, ctype_, ReduceOp::kSum);
  in_flight_elems_ += up.padded;
  pending_.push_back(std::move(p));
  if (!opt_.overlap_comm) {
    retire_oldest();
    return;
  }
  // Bound the buckets in flight (always allow one).
  while (pending_.size() > 1 && in_flight_elems_ > opt_.reduce_bucket_size) retire_oldest();
}

void GradReducer::retire_oldest() {
  Pending p = std::move(pending_.front());
  pending_.pop_front();
  wait(p.work);
  if (sharded_grads()) {
    const UnitPartition& up = part_.unit(p.unit);
    in_flight_elems_ -= up.padded;
    if (!p.partial.empty()) {
      be_.residual_forward(shard(p.unit), shard(p.unit), p.partial.data(), up.shard);  // +=
      pool_.give(std::move(p.partial));
    }
    be_.round_to_compute(shard(p.unit), up.shard);
    pool_.give(std::move(p.scratch));
  }
}

void GradReducer::finish() {
  launch_bucket();  // (what the last units left unsent: units that end above unit 0)
  while (!pending_.empty()) retire_oldest();
  if (compress_) {
    Stopwatch sw;
    opt_.compression->reduce(full_.data());
    wait_seconds_ += sw.seconds();
    compress_ = false;
  }
  compress_decided_ = false;
  if (!sharded_grads() && distributed() && reduces()) {
    // Stages 0-1 reduced in the storage arrays: round the sums to the compute dtype (no-op for
    // fp32 and for real 16-bit storage).
    for (int u = 0; u < part_.num_units(); ++u) be_.round_to_compute(shard(u), part_.unit(u).shard);
  }
}

}  // namespace zerod
