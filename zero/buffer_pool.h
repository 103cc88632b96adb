// Reusable scratch buffers for ZeRO (stage-2/3 gradient buckets, stage-3 gathered weights):
// freed buffers are kept and handed out again for the same size, so the steady state allocates
// nothing and first-touch page faults happen once. Every buffer, free or in use, stays charged
// to the pool's memory category.
#pragma once

#include <cstddef>
#include <vector>

#include "core/memory.h"
#include "kernels/backend.h"

namespace zerod {

class BufferPool {
 public:
  BufferPool(Backend& backend, MemCategory category, MemoryTracker* tracker)
      : be_(backend), category_(category), tracker_(tracker) {}

  // A buffer of exactly `bytes` (reused when one is free; zero-filled when `zero`).
  Buffer take(size_t bytes, bool zero);
  void give(Buffer buffer);
  size_t bytes_in_use() const { return in_use_; }

 private:
  Backend& be_;
  MemCategory category_;
  MemoryTracker* tracker_;
  std::vector<Buffer> free_;
  size_t in_use_ = 0;
};

}  // namespace zerod
