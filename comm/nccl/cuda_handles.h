// The CUDA runtime objects of the NCCL backend as owning handles: the current device switched
// for a scope, a stream, an event, a small device buffer. Destructors never throw (CUDA errors
// there, e.g. at process exit after the runtime unloaded, are ignored). Only the CUDA runtime
// (linked statically) is used: binaries start on machines without a driver.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace zerod::nccl_backend {

// GPUs visible to this process (0 without a driver or a device; never throws; clears the error
// the runtime records when there is none).
int gpu_count();

// Makes `device` the calling thread's current device for the scope and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int device_;
  int previous_ = -1;
};

// A stream of `device` that does not synchronize with the legacy default stream
// (cudaStreamNonBlocking): collectives on it never wait for, or hold up, unrelated work there.
class CudaStream {
 public:
  explicit CudaStream(int device);
  ~CudaStream();
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
};

// An event of `device` without timing (cudaEventDisableTiming: the cheapest to record and query).
class CudaEvent {
 public:
  explicit CudaEvent(int device);
  ~CudaEvent();
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  int device_;
  cudaEvent_t event_ = nullptr;
};

// `bytes` of device memory on `device`, zeroed.
class DeviceScratch {
 public:
  DeviceScratch(int device, size_t bytes);
  ~DeviceScratch();
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
  void* get() const { return ptr_; }

 private:
  int device_;
  void* ptr_ = nullptr;
};

}  // namespace zerod::nccl_backend
