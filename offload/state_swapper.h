// NVMe offload of optimizer states (ZeRO-Infinity): a rank's fp32 master weights and Adam
// moments live in one swap file and pass through a few host buffers, one sub-group at a time.
//
// The rank's optimizer shard (`elems` floats of each state, every unit's shard back to back) is
// cut into sub-groups of `group_elems` (zero_optimization.sub_group_size, rounded up to whole
// 4 KiB blocks). Sub-group g sits at offset g * stride in the file as three arrays:
//
//   [ master: group_elems floats | exp_avg: group_elems | exp_avg_sq: group_elems ]
//
// so one O_DIRECT request moves one sub-group. visit() walks sub-groups in order through
// buffer_count host buffers (each 12 * group_elems bytes): with pipeline_read the next
// sub-group is read while this one is processed, with pipeline_write the last one is written
// meanwhile, so an optimizer step overlaps read, update and write; prefetch() reads the first
// sub-groups ahead, during the step's backward, and with pipeline_write the last writes finish
// after the visit returned (the next visit or prefetch waits for them and reports their errors;
// so does a checkpoint, which visits to read). The file is allocated in
// full when created (posix_fallocate), so a disk that fills up later cannot fail a step; it is
// removed with the swapper. Host memory: buffer_count buffers, charged to MemCategory::kSwap,
// locked in RAM (mlock) with pin_memory.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/memory.h"
#include "offload/aio/aio_engine.h"
#include "offload/host_registrar.h"

namespace zerod {

struct SwapOptions {
  int64_t group_elems = 1000000000;  // sub_group_size (rounded up to kAioAlign / 4 floats)
  int buffer_count = 4;              // host buffers, each one sub-group's three states
  bool pipeline_read = false;        // read the next sub-group while this one is processed
  bool pipeline_write = false;       // write the last sub-group while this one is processed
  bool pin_memory = false;           // mlock the buffers
  AioOptions aio;
  HostRegistrar registrar;  // the device copying to and from the buffers (GPU runs)
};

// Bytes of I/O and the time the caller waited for it, since construction.
struct SwapStats {
  int64_t read_bytes = 0, write_bytes = 0;
  double wait_seconds = 0;  // time visit() spent blocked on reads and writes
};

class StateSwapper {
 public:
  // Creates `path` (its folder must exist) with room for `elems` elements of each state.
  StateSwapper(std::string path, int64_t elems, const SwapOptions& options, MemoryTracker* tracker);
  ~StateSwapper();  // removes the file
  StateSwapper(const StateSwapper&) = delete;
  StateSwapper& operator=(const StateSwapper&) = delete;

  enum class Mode {
    kRead,       // read, not written back
    kUpdate,     // read, then written back
    kOverwrite,  // every element in range is overwritten: not read (unless only part of a
                 // sub-group is in range), written back
  };
  // fn(begin, end, master, exp_avg, exp_avg_sq): the states of elements [begin, end), a piece of
  // one sub-group (pointers at element `begin`).
  using Visitor = std::function<void(int64_t begin, int64_t end, float* master, float* exp_avg,
                                     float* exp_avg_sq)>;
  // Visits [begin, end) sub-group by sub-group, in order (see the header comment). An I/O error
  // is thrown (naming the file and offset) after the requests in flight have finished; with
  // pipeline_write, an error of the last writes is thrown by the next visit or prefetch.
  void visit(Mode mode, int64_t begin, int64_t end, const Visitor& fn);
  // With pipeline_read: starts reading the first sub-groups into every buffer now, so that the
  // next visit from element 0 (an optimizer step) finds them read; ZeRO calls it when the last
  // micro-batch of a step begins, so the reads overlap its forward and backward. A visit of
  // another kind waits for them and reads for itself. No-op without pipeline_read or when a
  // prefetch is already pending.
  void prefetch();

  int64_t elems() const { return elems_; }
  int64_t group_elems() const { return group_elems_; }
  int num_groups() const { return num_groups_; }
  int64_t file_bytes() const { return stride_ * num_groups_; }  // on disk
  int64_t buffer_bytes() const;                                 // host, all buffers
  const std::string& path() const { return path_; }
  const SwapStats& stats() const { return stats_; }
  // The sub-group a swapper of `elems` elements uses for `group_elems` asked (rounded up to
  // whole blocks, at most elems), and the bytes its file and its host buffers take.
  static int64_t group_elems_for(int64_t elems, int64_t group_elems);
  static int64_t file_bytes_for(int64_t elems, int64_t group_elems);
  static int64_t buffer_bytes_for(int64_t elems, const SwapOptions& options);

 private:
  struct Slot;
  void ensure_slots();  // the buffers, made on first use
  void drain();         // waits for every request in flight (rethrows the first error)
  std::string path_;
  int64_t elems_, group_elems_, stride_;
  int num_groups_;
  SwapOptions opt_;
  MemoryTracker* tracker_;
  std::unique_ptr<AioFile> file_;
  std::unique_ptr<AioEngine> aio_;
  std::vector<std::unique_ptr<Slot>> slots_;  // made on first use
  int prefetched_ = 0;  // sub-groups [0, prefetched_) are being read into slots [0, ..)
  SwapStats stats_;
};

}  // namespace zerod
