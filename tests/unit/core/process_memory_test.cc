// core/process_memory.h: VmRSS grows by the pages a buffer touches, and VmHWM keeps the peak
// after they are returned (within the slack of the kernel's per-thread counters).
#include "core/process_memory.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>

namespace zerod {
namespace {

TEST(ProcessMemory, ResidentBytesFollowTouchedPagesAndThePeakStays) {
  const int64_t before = resident_bytes();
  ASSERT_GT(before, 0);
  EXPECT_GE(peak_resident_bytes(), before);
  constexpr size_t kBytes = size_t(64) << 20;  // fresh pages from the kernel, not the heap
  // The kernel's counters are per-thread caches folded in now and then: a few pages of slack.
  constexpr int64_t kSlack = int64_t(1) << 20;
  void* p = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  std::memset(p, 1, kBytes);
  const int64_t touched = resident_bytes();
  EXPECT_GE(touched - before, int64_t(kBytes) * 9 / 10);
  EXPECT_GE(peak_resident_bytes(), touched - kSlack);
  ::munmap(p, kBytes);
  EXPECT_LE(resident_bytes(), touched - int64_t(kBytes) * 9 / 10);
  EXPECT_GE(peak_resident_bytes(), touched - kSlack);  // the high-water mark does not come down
}

}  // namespace
}  // namespace zerod
