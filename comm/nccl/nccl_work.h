// One collective of the NCCL backend (comm/nccl/): the Work its caller waits on.
//
// Two events on the communication stream bracket the NCCL kernel: `start` is recorded after the
// wait for the compute stream, just before the kernel (its completion means the collective has
// started on the GPU: the timeout counts from then), `end` just after it. The Watchdog
// (nccl_watchdog.h) moves the work from queued to started to finished (successfully or with an
// error); wait() polls through the watchdog until then, then makes the compute stream wait for
// `end`.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "comm/communicator.h"
#include "comm/nccl/cuda_handles.h"
#include "core/error.h"

namespace zerod::nccl_backend {

class Watchdog;

class NcclWork final : public Work {
 public:
  // `what`: "all_reduce #5 (1001 x f32, sum)". `compute`: the stream wait() orders after the
  // collective (nullptr: the legacy default stream of `device`). No events yet.
  NcclWork(int64_t seq, std::string what, int device, cudaStream_t compute,
           std::shared_ptr<Watchdog> owner);

  // Creates the start and end events (throws Error on a CUDA failure).
  void create_events();
  cudaEvent_t start_event() const { return start_ ? start_->get() : nullptr; }
  cudaEvent_t end_event() const { return end_ ? end_->get() : nullptr; }

  void wait() override;
  bool done() const override;
  int64_t sequence() const override { return seq_; }
  const std::string& what() const { return what_; }

 private:
  friend class Watchdog;
  enum class Phase : uint8_t { kQueued, kStarted, kFinished };

  const int64_t seq_;
  const std::string what_;
  const int device_;
  const cudaStream_t compute_;
  const std::shared_ptr<Watchdog> owner_;
  std::unique_ptr<CudaEvent> start_, end_;

  // Guarded by the watchdog's mutex.
  Phase phase_ = Phase::kQueued;
  std::chrono::steady_clock::time_point started_at_{};
  std::optional<Error> error_;
};

}  // namespace zerod::nccl_backend
