#include "comm/nccl/nccl_work.h"

#include <fmt/format.h>

#include "comm/nccl/nccl_error.h"
#include "comm/nccl/nccl_watchdog.h"

namespace zerod::nccl_backend {

NcclWork::NcclWork(int64_t seq, std::string what, int device, cudaStream_t compute,
                   std::shared_ptr<Watchdog> owner)
    : seq_(seq),
      what_(std::move(what)),
      device_(device),
      compute_(compute),
      owner_(std::move(owner)) {}

void NcclWork::create_events() {
  start_ = std::make_unique<CudaEvent>(device_);
  end_ = std::make_unique<CudaEvent>(device_);
}

void NcclWork::wait() {
  DeviceGuard guard(device_);
  owner_->wait(*this);  // throws the collective's error
  // Done on the host already; this keeps the stream order explicit for a compute stream that
  // other threads feed, and costs nothing on the GPU.
  cuda_check(cudaStreamWaitEvent(compute_, end_->get(), 0),
             fmt::format("{}: making the compute stream wait for it", what_));
}

bool NcclWork::done() const {
  return owner_->finished(*this);
}

}  // namespace zerod::nccl_backend
