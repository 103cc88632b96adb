#include "core/memory.h"

#include <fmt/format.h>

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace zerod {

std::string_view mem_category_name(MemCategory c) {
  switch (c) {
    case MemCategory::kWeights:
      return "weights";
    case MemCategory::kGradients:
      return "gradients";
    case MemCategory::kMaster:
      return "master";
    case MemCategory::kMoments:
      return "moments";
    case MemCategory::kGathered:
      return "gathered";
    case MemCategory::kBuckets:
      return "buckets";
    case MemCategory::kActivations:
      return "activations";
    case MemCategory::kPinned:
      return "pinned";
    case MemCategory::kWorkspace:
      return "workspace";
    case MemCategory::kCheckpoint:
      return "checkpoint";
    case MemCategory::kOffloaded:
      return "offloaded";
    case MemCategory::kSwap:
      return "swap";
    case MemCategory::kOther:
      return "other";
    case MemCategory::kCount:
      break;
  }
  return "?";
}

namespace {
void raise_max(std::atomic<int64_t>& peak, int64_t value) {
  int64_t prev = peak.load(std::memory_order_relaxed);
  while (prev < value && !peak.compare_exchange_weak(prev, value, std::memory_order_relaxed)) {
  }
}
}  // namespace

void MemoryTracker::add(MemCategory c, int64_t bytes) {
  const size_t i = static_cast<size_t>(c);
  raise_max(peak_[i], current_[i].fetch_add(bytes, std::memory_order_relaxed) + bytes);
  raise_max(total_peak_, total_.fetch_add(bytes, std::memory_order_relaxed) + bytes);
}

void MemoryTracker::sub(MemCategory c, int64_t bytes) {
  current_[static_cast<size_t>(c)].fetch_sub(bytes, std::memory_order_relaxed);
  total_.fetch_sub(bytes, std::memory_order_relaxed);
}

int64_t MemoryTracker::current(MemCategory c) const {
  return current_[static_cast<size_t>(c)].load(std::memory_order_relaxed);
}
int64_t MemoryTracker::peak(MemCategory c) const {
  return peak_[static_cast<size_t>(c)].load(std::memory_order_relaxed);
}

MemoryTracker::Snapshot MemoryTracker::snapshot() const {
  Snapshot s;
  for (size_t i = 0; i < kN; ++i) {
    s.current[i] = current_[i].load(std::memory_order_relaxed);
    s.peak[i] = peak_[i].load(std::memory_order_relaxed);
  }
  s.total_current = total_.load(std::memory_order_relaxed);
  s.total_peak = total_peak_.load(std::memory_order_relaxed);
  return s;
}

void MemoryTracker::reset_peaks() {
  for (size_t i = 0; i < kN; ++i) peak_[i].store(current_[i].load());
  total_peak_.store(total_.load());
}

namespace {
constexpr size_t kHugeThreshold = size_t{4} << 20;
constexpr size_t kHugePage = size_t{2} << 20;
void host_release(void* data, size_t) {
  std::free(data);
}
}  // namespace

Buffer::Buffer(void* data, size_t bytes, Release release, MemCategory category,
               MemoryTracker* tracker)
    : data_(data), bytes_(bytes), release_(release), category_(category), tracker_(tracker) {
  if (tracker_ && bytes_ > 0) tracker_->add(category_, static_cast<int64_t>(bytes_));
}

Buffer::~Buffer() {
  reset();
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    release_ = std::exchange(o.release_, nullptr);
    category_ = o.category_;
    tracker_ = std::exchange(o.tracker_, nullptr);
  }
  return *this;
}

void Buffer::reset() {
  if (data_ != nullptr && release_ != nullptr) release_(data_, bytes_);
  if (tracker_ && bytes_ > 0) tracker_->sub(category_, static_cast<int64_t>(bytes_));
  data_ = nullptr;
  bytes_ = 0;
  release_ = nullptr;
  tracker_ = nullptr;
}

Buffer host_alloc(size_t bytes, MemCategory category, MemoryTracker* tracker) {
  if (bytes == 0) return Buffer(nullptr, 0, nullptr, category, tracker);
  const size_t align = bytes >= kHugeThreshold ? kHugePage : 64;
  const size_t rounded = (bytes + align - 1) / align * align;
  void* data = std::aligned_alloc(align, rounded);
  if (data == nullptr) {
    ZD_THROW("out of host memory allocating {} bytes for {}", bytes, mem_category_name(category));
  }
  if (align == kHugePage) madvise(data, rounded, MADV_HUGEPAGE);
  std::memset(data, 0, bytes);
  return Buffer(data, bytes, host_release, category, tracker);
}

std::string MemoryTracker::describe() const {
  const Snapshot snap = snapshot();
  auto mib = [](int64_t b) { return static_cast<double>(b) / (1 << 20); };
  std::string line;
  for (size_t i = 0; i < snap.peak.size(); ++i) {
    line += fmt::format("{}{} {:.2f}/{:.2f}", line.empty() ? "" : ", ",
                        mem_category_name(static_cast<MemCategory>(i)), mib(snap.current[i]),
                        mib(snap.peak[i]));
  }
  line += ", disk 0.00/0.00";  // offload files: not built yet
  return fmt::format("{}; total {:.2f}/{:.2f} MiB (current/peak)", line, mib(snap.total_current),
                     mib(snap.total_peak));
}

}  // namespace zerod
