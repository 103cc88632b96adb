// Helpers of the NCCL backend tests: the GPU-count skip, device buffers of test values, and worlds
// of NCCL communicators whose ranks are threads of this process (one GPU each), created and
// destroyed concurrently (NCCL synchronizes the ranks of a node in both).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/nccl/cuda_handles.h"
#include "comm/nccl/nccl_communicator.h"
#include "comm/nccl/nccl_error.h"
#include "tests/unit/comm/comm_test_util.h"

namespace zerod::test {

inline int gpus() {
  return nccl_backend::gpu_count();
}

// First statement of a test that needs `n` GPUs.
#define ZD_NEED_GPUS(n)                                                                         \
  do {                                                                                          \
    if (::zerod::test::gpus() < (n)) {                                                          \
      GTEST_SKIP() << "needs " << (n) << " GPU(s); this machine has " << ::zerod::test::gpus(); \
    }                                                                                           \
  } while (0)

// n elements of T in device memory of `device`, zeroed.
template <typename T>
class DeviceVec {
 public:
  DeviceVec(int device, size_t n)
      : device_(device), n_(n), mem_(device, std::max<size_t>(n, 1) * sizeof(T)) {}
  DeviceVec(int device, const std::vector<T>& host) : DeviceVec(device, host.size()) {
    upload(host);
  }

  T* data() const { return static_cast<T*>(mem_.get()); }
  size_t size() const { return n_; }

  void upload(const std::vector<T>& host, size_t offset = 0) {
    nccl_backend::DeviceGuard guard(device_);
    nccl_backend::cuda_check(
        cudaMemcpy(data() + offset, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
        "upload");
    // A pageable upload may return before its DMA ends: finish it for every stream.
    nccl_backend::cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  std::vector<T> download() const {
    nccl_backend::DeviceGuard guard(device_);
    std::vector<T> host(n_);
    nccl_backend::cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    nccl_backend::cuda_check(
        cudaMemcpy(host.data(), data(), n_ * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return host;
  }

 private:
  int device_;
  size_t n_;
  nccl_backend::DeviceScratch mem_;
};

// values<T>(r, n, from): value<T>(r, from + i) for i < n (comm_test_util.h).
template <typename T>
std::vector<T> values(int r, size_t n, size_t from = 0) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = value<T>(r, from + i);
  return v;
}

// Calls f(T{}) for every CommType's element type.
template <class F>
void for_each_type(F&& f) {
  f(float{});
  f(double{});
  f(int32_t{});
  f(int64_t{});
  f(uint8_t{});
}

inline NcclOptions nccl_options(int rank, int size, std::shared_ptr<Store> store, Ms timeout,
                                std::string prefix = "world",
                                std::shared_ptr<PeerMonitor> monitor = nullptr) {
  NcclOptions o;
  o.rank = rank;
  o.size = size;
  o.device = rank;
  o.store = std::move(store);
  o.key_prefix = std::move(prefix);
  o.timeout = timeout;
  o.monitor = std::move(monitor);
  return o;
}

// n NCCL ranks on GPUs 0..n-1; the destructor destroys them concurrently.
struct NcclWorld {
  std::shared_ptr<MemoryStore> store = std::make_shared<MemoryStore>();
  std::shared_ptr<LocalPeerMonitor> monitor;
  std::vector<std::unique_ptr<Communicator>> comms;

  NcclWorld() = default;
  NcclWorld(NcclWorld&&) = default;
  ~NcclWorld() { destroy(); }
  void destroy() {
    if (comms.empty()) return;
    run_ranks(static_cast<int>(comms.size()),
              [&](int r) { comms[static_cast<size_t>(r)].reset(); });
    comms.clear();
  }
};

inline NcclWorld make_nccl_world(int n, Ms timeout = Ms(30000)) {
  NcclWorld w;
  w.monitor = std::make_shared<LocalPeerMonitor>(n);
  w.comms.resize(static_cast<size_t>(n));
  run_ranks(n, [&](int r) {
    w.comms[static_cast<size_t>(r)] =
        make_nccl_communicator(nccl_options(r, n, w.store, timeout, "world", w.monitor));
  });
  return w;
}

}  // namespace zerod::test
