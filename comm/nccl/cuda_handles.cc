#include "comm/nccl/cuda_handles.h"

#include <fmt/format.h>

#include "comm/nccl/nccl_error.h"

namespace zerod::nccl_backend {

namespace {

// DeviceGuard for destructors: switches quietly and ignores every error.
class QuietDevice {
 public:
  explicit QuietDevice(int device) : device_(device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device_ && cudaSetDevice(device_) != cudaSuccess) cudaGetLastError();
  }
  ~QuietDevice() {
    if (previous_ >= 0 && previous_ != device_ && cudaSetDevice(previous_) != cudaSuccess) {
      cudaGetLastError();
    }
  }

 private:
  int device_;
  int previous_ = -1;
};

}  // namespace

int gpu_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // "no driver" / "no device" is recorded as the thread's last error
    return 0;
  }
  return n;
}

DeviceGuard::DeviceGuard(int device) : device_(device) {
  if (cudaGetDevice(&previous_) != cudaSuccess) {
    cudaGetLastError();
    previous_ = -1;
  }
  if (previous_ != device_) {
    cuda_check(cudaSetDevice(device_), fmt::format("cudaSetDevice({})", device_));
  }
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0 && previous_ != device_ && cudaSetDevice(previous_) != cudaSuccess) {
    cudaGetLastError();
  }
}

CudaStream::CudaStream(int device) : device_(device) {
  DeviceGuard guard(device_);
  cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
             fmt::format("creating a stream on GPU {}", device_));
}

CudaStream::~CudaStream() {
  if (stream_ == nullptr) return;
  QuietDevice device(device_);
  if (cudaStreamDestroy(stream_) != cudaSuccess) cudaGetLastError();
}

CudaEvent::CudaEvent(int device) : device_(device) {
  DeviceGuard guard(device_);
  cuda_check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming),
             fmt::format("creating an event on GPU {}", device_));
}

CudaEvent::~CudaEvent() {
  if (event_ == nullptr) return;
  QuietDevice device(device_);
  if (cudaEventDestroy(event_) != cudaSuccess) cudaGetLastError();
}

DeviceScratch::DeviceScratch(int device, size_t bytes) : device_(device) {
  DeviceGuard guard(device_);
  cuda_check(cudaMalloc(&ptr_, bytes), fmt::format("cudaMalloc({}) on GPU {}", bytes, device_));
  // Zeroed before any stream (also non-blocking ones) can use it.
  cudaError_t zeroed = cudaMemset(ptr_, 0, bytes);
  if (zeroed == cudaSuccess) zeroed = cudaStreamSynchronize(nullptr);
  if (zeroed != cudaSuccess) {
    cudaFree(ptr_);
    ptr_ = nullptr;
    cuda_check(zeroed, fmt::format("cudaMemset({}) on GPU {}", bytes, device_));
  }
}

DeviceScratch::~DeviceScratch() {
  if (ptr_ == nullptr) return;
  QuietDevice device(device_);
  if (cudaFree(ptr_) != cudaSuccess) cudaGetLastError();
}

}  // namespace zerod::nccl_backend
