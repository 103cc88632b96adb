#include "zero/param_gatherer.h"

#include "core/error.h"
#include "core/timer.h"
#include "zero/compute_comm.h"

namespace zerod {

ParamGatherer::ParamGatherer(const Partition& partition, Backend& backend,
                             const GathererOptions& options, void* shards, MemoryTracker* tracker)
    : part_(partition),
      be_(backend),
      opt_(options),
      shards_(static_cast<char*>(shards)),
      esz_(backend.compute_elem_size()),
      pool_(backend, MemCategory::kGathered, tracker),
      tracker_(tracker),
      slots_(static_cast<size_t>(partition.num_units())) {
  ZD_CHECK(opt_.comm != nullptr, "stage 3 needs a communicator");
  for (int u = 0; u < part_.num_units(); ++u) {
    ZD_CHECK(!part_.unit(u).experts || opt_.expert_comm != nullptr,
             "unit {} is split over the experts' group, which has no communicator", u);
    Slot& s = slots_[static_cast<size_t>(u)];
    s.persistent = part_.unit(u).numel <= opt_.param_persistence_threshold;
    if (s.persistent) {
      s.buffer = be_.allocate(static_cast<size_t>(part_.unit(u).padded) * esz_,
                              MemCategory::kGathered, tracker_);
    }
  }
}

ParamGatherer::~ParamGatherer() {
  for (auto& s : slots_) {
    try {
      if (s.work) s.work->wait();
    } catch (...) {
    }
  }
}

void ParamGatherer::start_gather(int unit) {
  Slot& s = slots_[static_cast<size_t>(unit)];
  const UnitPartition& up = part_.unit(unit);
  if (!s.persistent) {
    s.buffer = pool_.take(static_cast<size_t>(up.padded) * esz_, false);
    live_ += up.padded;
  }
  const void* shard = shards_ + part_.shard_offset(unit) * static_cast<int64_t>(esz_);
  Communicator& comm = comm_of(unit);
  if (opt_.shard_of) {
    void* in_place = static_cast<char*>(s.buffer.data()) +
                     static_cast<int64_t>(comm.rank()) * up.shard * static_cast<int64_t>(esz_);
    shard = opt_.shard_of(unit, in_place);
  }
  s.work = comm.all_gather_async(shard, s.buffer.data(), up.shard, compute_comm_type(be_));
}

void ParamGatherer::finish_gather(Slot& s) {
  if (!s.work) return;
  Stopwatch sw;
  WorkPtr w = std::move(s.work);
  w->wait();
  wait_seconds_ += sw.seconds();
}

const void* ParamGatherer::acquire(int unit) {
  Slot& s = slots_[static_cast<size_t>(unit)];
  if (!s.persistent && s.buffer.empty()) start_gather(unit);
  finish_gather(s);
  ++s.refs;
  return s.buffer.data();
}

void ParamGatherer::release(int unit) {
  Slot& s = slots_[static_cast<size_t>(unit)];
  ZD_CHECK(s.refs > 0, "release of unit {} that is not acquired", unit);
  if (--s.refs > 0 || s.persistent) return;
  finish_gather(s);  // (a prefetch may still be in flight only if never acquired)
  live_ -= part_.unit(unit).padded;
  pool_.give(std::move(s.buffer));
}

void ParamGatherer::prefetch(int unit) {
  if (unit < 0 || unit >= part_.num_units()) return;
  Slot& s = slots_[static_cast<size_t>(unit)];
  const int64_t n = part_.unit(unit).padded;
  if (s.persistent || !s.buffer.empty()) return;
  if (n > opt_.prefetch_bucket_size || live_ + n > opt_.max_live_parameters) return;
  start_gather(unit);
}

void ParamGatherer::shards_changed() {
  for (int u = 0; u < part_.num_units(); ++u) {
    Slot& s = slots_[static_cast<size_t>(u)];
    ZD_CHECK(s.refs == 0, "unit {} is still acquired at the optimizer step", u);
    finish_gather(s);
    if (s.persistent) {
      start_gather(u);
    } else if (!s.buffer.empty()) {
      live_ -= part_.unit(u).padded;
      pool_.give(std::move(s.buffer));
    }
  }
  for (auto& s : slots_) finish_gather(s);
}

}  // namespace zerod
