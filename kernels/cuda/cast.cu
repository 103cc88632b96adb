#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/error.h"
#include "kernels/cuda/cast.h"

namespace zerod::cuda {

namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 * 16 ? b : 65535 * 16);
}

__global__ void f32_to_bf16_kernel(uint16_t* out, const float* in, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(in[i]));
  }
}

__global__ void f32_to_f16_kernel(uint16_t* out, const float* in, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = __half_as_ushort(__float2half_rn(in[i]));
  }
}

__global__ void bf16_to_f32_kernel(float* out, const uint16_t* in, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = __bfloat162float(__ushort_as_bfloat16(in[i]));
  }
}

__global__ void f16_to_f32_kernel(float* out, const uint16_t* in, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = __half2float(__ushort_as_half(in[i]));
  }
}

}  // namespace

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) ZD_THROW("{}: CUDA error {}: {}", what, cudaGetErrorName(status), cudaGetErrorString(status));
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver/device" error
    return 0;
  }
  return n;
}

void cast_f32_to_bf16(uint16_t* out, const float* in, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  f32_to_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(out, in, n);
  check(cudaGetLastError(), "cast_f32_to_bf16");
}

void cast_f32_to_f16(uint16_t* out, const float* in, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  f32_to_f16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(out, in, n);
  check(cudaGetLastError(), "cast_f32_to_f16");
}

void cast_bf16_to_f32(float* out, const uint16_t* in, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  bf16_to_f32_kernel<<<blocks_for(n), kThreads, 0, stream>>>(out, in, n);
  check(cudaGetLastError(), "cast_bf16_to_f32");
}

void cast_f16_to_f32(float* out, const uint16_t* in, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  f16_to_f32_kernel<<<blocks_for(n), kThreads, 0, stream>>>(out, in, n);
  check(cudaGetLastError(), "cast_f16_to_f32");
}

}  // namespace zerod::cuda
