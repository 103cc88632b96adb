// Grid-stride loop, 256 threads per block.
#include "kernels/cuda/cast.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/residual.h"

namespace zerod::cuda {

namespace {

template <class T>
__global__ void residual_forward_kernel(T* out, const T* a, const T* b, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    out[i] = from_f32<T>(to_f32(a[i]) + to_f32(b[i]));
  }
}

}  // namespace

void residual_forward(Storage dt, void* out, const void* a, const void* b, int64_t n,
                      cudaStream_t stream) {
  if (n <= 0) return;
  dispatch(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    residual_forward_kernel<T><<<grid_stride_blocks(n), kElementwiseThreads, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), n);
  });
  check(cudaGetLastError(), "residual_forward kernel launch");
}

}  // namespace zerod::cuda
