// sum_squares: min(ceil(n/256), 1024) blocks of 256 threads, grid-stride, double accumulation,
// a block reduction per block into partial[blockIdx.x]. scale: grid-stride, 256 threads.
#include "kernels/cuda/cast.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/reduce.h"

namespace zerod::cuda {

namespace {

constexpr int kThreads = 256;

template <class T>
__global__ void sum_squares_kernel(double* partial, const T* x, int64_t n) {
  __shared__ double shared[32];
  double s = 0.0;
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    const double d = to_f32(x[i]);
    s += d * d;
  }
  s = block_all_reduce(s, SumOp{}, 0.0, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

template <class T>
__global__ void scale_kernel(T* x, float s, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    x[i] = from_f32<T>(to_f32(x[i]) * s);
  }
}

}  // namespace

int sum_squares_partials(Storage dt, double* partial, const void* x, int64_t n,
                         cudaStream_t stream) {
  if (n <= 0) return 0;
  const int64_t wanted = (n + kThreads - 1) / kThreads;
  const int blocks =
      static_cast<int>(wanted < kSumSquaresMaxBlocks ? wanted : kSumSquaresMaxBlocks);
  dispatch(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    sum_squares_kernel<T><<<blocks, kThreads, 0, stream>>>(partial, static_cast<const T*>(x), n);
  });
  check(cudaGetLastError(), "sum_squares kernel launch");
  return blocks;
}

void scale(Storage dt, void* x, float s, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  dispatch(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    scale_kernel<T>
        <<<grid_stride_blocks(n), kElementwiseThreads, 0, stream>>>(static_cast<T*>(x), s, n);
  });
  check(cudaGetLastError(), "scale kernel launch");
}

}  // namespace zerod::cuda
