// Host memory: aligned, owned buffers whose bytes are charged to a category of a MemoryTracker,
// so a rank can report current and peak bytes per category (weights, gradients, master, ...).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>

namespace zerod {

enum class MemCategory : uint8_t {
  kWeights = 0,  // compute-dtype parameters (full, or a stage-3 shard)
  kGradients,    // parameter gradients (full or shard)
  kMaster,       // fp32 master weights
  kMoments,      // Adam m and v
  kGathered,     // stage-3 gathered unit buffers
  kBuckets,      // gradient reduction buckets
  kActivations,  // forward activations and backward scratch
  kPinned,       // pinned host staging buffers
  kWorkspace,    // kernel scratch
  kCheckpoint,   // snapshots of model states for background checkpoint writes
  kOffloaded,    // model states offloaded to host memory (offload_optimizer: cpu)
  kSwap,         // host buffers that NVMe-offloaded states pass through
  kOther,
  kCount
};
std::string_view mem_category_name(MemCategory c);

// Per-rank accounting of live bytes. Thread-safe (buffers may be freed from other threads).
class MemoryTracker {
 public:
  struct Snapshot {
    std::array<int64_t, static_cast<size_t>(MemCategory::kCount)> current{};
    std::array<int64_t, static_cast<size_t>(MemCategory::kCount)> peak{};
    int64_t total_current = 0;
    int64_t total_peak = 0;
  };

  void add(MemCategory c, int64_t bytes);
  void sub(MemCategory c, int64_t bytes);
  int64_t current(MemCategory c) const;
  int64_t peak(MemCategory c) const;
  int64_t total() const { return total_.load(std::memory_order_relaxed); }
  int64_t total_peak() const { return total_peak_.load(std::memory_order_relaxed); }
  Snapshot snapshot() const;
  // "weights 0.46/0.46, gradients 0.46/0.46, ..., disk 0/0; total 4.39/4.39 MiB (current/peak)":
  // every category (those not in use as 0), and disk (offload files; none yet).
  std::string describe() const;
  void reset_peaks();

 private:
  static constexpr size_t kN = static_cast<size_t>(MemCategory::kCount);
  std::array<std::atomic<int64_t>, kN> current_{};
  std::array<std::atomic<int64_t>, kN> peak_{};
  std::atomic<int64_t> total_{0};
  std::atomic<int64_t> total_peak_{0};
};

// An owned allocation charged to a category of a MemoryTracker: host memory from host_alloc(),
// device memory from a device backend (which passes its own release function). Movable only.
class Buffer {
 public:
  using Release = void (*)(void* data, size_t bytes);

  Buffer() = default;
  Buffer(void* data, size_t bytes, Release release, MemCategory category, MemoryTracker* tracker);
  ~Buffer();
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() { return data_; }
  const void* data() const { return data_; }
  template <class T>
  T* as() {
    return static_cast<T*>(data_);
  }
  template <class T>
  const T* as() const {
    return static_cast<const T*>(data_);
  }
  size_t bytes() const { return bytes_; }
  bool empty() const { return bytes_ == 0; }
  MemCategory category() const { return category_; }
  void reset();

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Release release_ = nullptr;
  MemCategory category_ = MemCategory::kOther;
  MemoryTracker* tracker_ = nullptr;
};

// Zero-initialised host memory, 64-byte aligned (2 MiB aligned and backed by transparent huge
// pages when large).
Buffer host_alloc(size_t bytes, MemCategory category, MemoryTracker* tracker = nullptr);

}  // namespace zerod
