// A grid-stride loop over (row, q/k head, i < HS/2), 256 threads: each thread rotates one pair
// (x[i], x[i + HS/2]) of one head, reading both before writing both (in place, no overlap
// between threads).
#include "kernels/cuda/cast.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/rope.h"

namespace zerod::cuda {

namespace {

// sign +1: the rotation by the tables' angles; -1: its inverse.
template <class T>
__global__ void rope_kernel(T* qkv, const float* cos, const float* sin, const int32_t* doc_start,
                            int64_t rows, int T_, int heads, int64_t row_stride, int HS,
                            float sign) {
  const int half = HS / 2;
  const int64_t total = rows * heads * half;
  for (int64_t idx = global_thread(); idx < total; idx += grid_threads()) {
    const int64_t rest = idx / half;
    const int i = static_cast<int>(idx - rest * half);
    const int64_t row = rest / heads;
    const int head = static_cast<int>(rest - row * heads);
    const int64_t t = row % T_ - (doc_start != nullptr ? doc_start[row] : 0);
    T* x = qkv + row * row_stride + static_cast<int64_t>(head) * HS;
    const float c = cos[t * half + i];
    const float s = sign * sin[t * half + i];
    const float x1 = to_f32(x[i]);
    const float x2 = to_f32(x[i + half]);
    x[i] = from_f32<T>(x1 * c - x2 * s);
    x[i + half] = from_f32<T>(x2 * c + x1 * s);
  }
}

void rope(Storage dt, void* qkv, const float* cos, const float* sin, const int32_t* doc_start,
          int B, int T, int NH, int KVH, int HS, float sign, cudaStream_t stream,
          const char* what) {
  const int64_t rows = static_cast<int64_t>(B) * T;
  const int heads = NH + KVH;  // q and k heads; v follows them
  const int64_t total = rows * heads * (HS / 2);
  if (total <= 0) return;
  const int64_t row_stride = static_cast<int64_t>(NH + 2 * KVH) * HS;
  dispatch(dt, [&](auto tag) {
    using E = typename decltype(tag)::type;
    rope_kernel<E><<<grid_stride_blocks(total), kElementwiseThreads, 0, stream>>>(
        static_cast<E*>(qkv), cos, sin, doc_start, rows, T, heads, row_stride, HS, sign);
  });
  check(cudaGetLastError(), what);
}

}  // namespace

void rope_forward(Storage dt, void* qkv, const float* cos, const float* sin, int B, int T, int NH,
                  int KVH, int HS, cudaStream_t stream, const int32_t* doc_start) {
  rope(dt, qkv, cos, sin, doc_start, B, T, NH, KVH, HS, 1.0f, stream, "rope_forward kernel launch");
}

void rope_backward(Storage dt, void* dqkv, const float* cos, const float* sin, int B, int T, int NH,
                   int KVH, int HS, cudaStream_t stream, const int32_t* doc_start) {
  rope(dt, dqkv, cos, sin, doc_start, B, T, NH, KVH, HS, -1.0f, stream,
       "rope_backward kernel launch");
}

}  // namespace zerod::cuda
