// Grid-stride loops, 256 threads per block, one element per thread per iteration.
#include "kernels/cuda/cast.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/gelu.h"

namespace zerod::cuda {

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

template <class T>
__global__ void gelu_forward_kernel(T* out, const T* inp, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    const float x = to_f32(inp[i]);
    const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
    out[i] = from_f32<T>(0.5f * x * (1.0f + tanhf(u)));
  }
}

template <class T>
__global__ void gelu_backward_kernel(T* dinp, const T* inp, const T* dout, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    const float x = to_f32(inp[i]);
    const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
    const float t = tanhf(u);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
    const float grad = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
    dinp[i] = from_f32<T>(grad * to_f32(dout[i]));
  }
}

}  // namespace

void gelu_forward(Storage dt, void* out, const void* inp, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  dispatch(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    gelu_forward_kernel<T><<<grid_stride_blocks(n), kElementwiseThreads, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(inp), n);
  });
  check(cudaGetLastError(), "gelu_forward kernel launch");
}

void gelu_backward(Storage dt, void* dinp, const void* inp, const void* dout, int64_t n,
                   cudaStream_t stream) {
  if (n <= 0) return;
  dispatch(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    gelu_backward_kernel<T><<<grid_stride_blocks(n), kElementwiseThreads, 0, stream>>>(
        static_cast<T*>(dinp), static_cast<const T*>(inp), static_cast<const T*>(dout), n);
  });
  check(cudaGetLastError(), "gelu_backward kernel launch");
}

}  // namespace zerod::cuda
