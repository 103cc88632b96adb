// Device memory for the GPU benchmarks: a checked CUDA call and an owned buffer. Benchmarks exit
// with status 1 on any CUDA error (they are programs, not library code).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace zerod::bench {

// Exits (status 1) naming the program's step and CUDA's message when `e` is an error.
inline void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// `bytes` of device memory, freed on destruction.
struct DeviceBuffer {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t n) : bytes(n) { cuda_ok(cudaMalloc(&p, n), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  std::vector<unsigned char> read() const {
    std::vector<unsigned char> h(bytes);
    cuda_ok(cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return h;
  }
};

}  // namespace zerod::bench
