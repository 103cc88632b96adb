#include "kernels/cpu/parallel.h"

#include <array>
#include <cstdlib>
#include <memory>

#include "core/error.h"

namespace zerod::cpu {

namespace {

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};

struct ScratchSlot {
  std::unique_ptr<float, FreeDeleter> data;
  size_t capacity = 0;
};

constexpr int kSlots = 4;

}  // namespace

float* thread_scratch(size_t n_floats, int slot) {
  thread_local std::array<ScratchSlot, kSlots> slots;
  ZD_CHECK(slot >= 0 && slot < kSlots, "scratch slot {} out of range [0, {})", slot, kSlots);
  ScratchSlot& s = slots[static_cast<size_t>(slot)];
  if (n_floats > s.capacity) {
    // Round up (64-byte multiple, and 25% headroom so slowly growing requests do not realloc).
    size_t cap = n_floats + n_floats / 4;
    cap = (cap + 15) / 16 * 16;
    s.data.reset();
    float* p = static_cast<float*>(std::aligned_alloc(64, cap * sizeof(float)));
    if (p == nullptr) ZD_THROW("out of memory allocating {} scratch floats", cap);
    s.data.reset(p);
    s.capacity = cap;
  }
  return s.data.get();
}

}  // namespace zerod::cpu
