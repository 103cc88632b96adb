// Device-side helpers shared by the .cu files of the CUDA backend (C++17, nvcc only): loads and
// stores of compute-dtype storage as fp32, the dtype dispatch of the launchers, warp and block
// reductions, grid sizing. Not for .cc files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cast.h"
#include "kernels/cuda/storage.h"

namespace zerod::cuda {

constexpr unsigned kFullMask = 0xffffffffu;

// ---- compute dtype <-> fp32 ------------------------------------------------------------------
__device__ __forceinline__ float to_f32(float x) {
  return x;
}
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
__device__ __forceinline__ float to_f32(__half x) {
  return __half2float(x);
}

// Round to nearest even (NaN stays NaN, fp16 overflows to infinity), as core/dtype.h.
template <class T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float x) {
  return __float2half_rn(x);
}

// ---- dtype dispatch (host) -------------------------------------------------------------------
template <class T>
struct TypeTag {
  using type = T;
};

// Calls fn(TypeTag<T>{}) with T the device type of `s` (float, __nv_bfloat16 or __half).
template <class Fn>
void dispatch(Storage s, Fn&& fn) {
  switch (s) {
    case Storage::kF32:
      fn(TypeTag<float>{});
      return;
    case Storage::kBF16:
      fn(TypeTag<__nv_bfloat16>{});
      return;
    case Storage::kF16:
      fn(TypeTag<__half>{});
      return;
  }
}

// Calls fn(TypeTag<T>{}) for the 16-bit storage types (the tensor-core kernels); fp32 is a CUDA
// "invalid value" error naming `what`.
template <class Fn>
void dispatch_16bit(Storage s, const char* what, Fn&& fn) {
  if (s == Storage::kBF16) {
    fn(TypeTag<__nv_bfloat16>{});
  } else if (s == Storage::kF16) {
    fn(TypeTag<__half>{});
  } else {
    check(cudaErrorInvalidValue, what);
  }
}

// Allows `bytes` of dynamic shared memory for `kernel` when over the default 48 KiB.
template <class Kernel>
void allow_dynamic_shared(Kernel kernel, size_t bytes, const char* what) {
  if (bytes > size_t{48} * 1024) {
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(bytes)),
          what);
  }
}

// ---- launch shapes ---------------------------------------------------------------------------
constexpr int kElementwiseThreads = 256;

// How a deterministic column sum over N rows is cut (a partial per chunk of rows, then the
// partials added in chunk order): at most 1024 chunks of at least min_rows rows each.
struct RowChunks {
  int64_t rows;   // rows per chunk (the last one may have fewer)
  int64_t count;  // chunks
};
inline RowChunks row_chunks(int64_t N, int64_t min_rows) {
  constexpr int64_t kMaxChunks = 1024;
  const int64_t even = (N + kMaxChunks - 1) / kMaxChunks;
  const int64_t rows = even > min_rows ? even : min_rows;
  return {rows, (N + rows - 1) / rows};
}

// Blocks of a grid-stride loop over n elements (capped; the loop covers the rest).
inline int grid_stride_blocks(int64_t n, int threads = kElementwiseThreads) {
  const int64_t b = (n + threads - 1) / threads;
  constexpr int64_t kMaxBlocks = int64_t{132} * 32;  // a few waves of every SM of an H100/H200
  return static_cast<int>(b < kMaxBlocks ? (b > 0 ? b : 1) : kMaxBlocks);
}

__device__ __forceinline__ int64_t global_thread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_threads() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// ---- vectorised elementwise maps -------------------------------------------------------------
// 16 bytes of T: 4 floats or 8 bf16 / fp16, loaded and stored as one vector.
template <class T>
struct alignas(16) Pack16 {
  static constexpr int kN = 16 / static_cast<int>(sizeof(T));
  T v[kN];
};

inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// out[i] = f(a[i]) (map1) or f(a[i], b[i]) (map2) in fp32, stored in T, for i < n: in 16-byte
// packs when `vec` (every pointer 16-byte aligned), the tail and unaligned tensors element by
// element. out may be a or b (each element is read before it is written, by the same thread).
template <class T, class F>
__global__ void map1_kernel(T* out, const T* a, int64_t n, bool vec, F f) {
  using P = Pack16<T>;
  const int64_t packs = vec ? n / P::kN : 0;
  for (int64_t p = global_thread(); p < packs; p += grid_threads()) {
    const P x = reinterpret_cast<const P*>(a)[p];
    P y;
#pragma unroll
    for (int k = 0; k < P::kN; ++k) y.v[k] = from_f32<T>(f(to_f32(x.v[k])));
    reinterpret_cast<P*>(out)[p] = y;
  }
  for (int64_t i = packs * P::kN + global_thread(); i < n; i += grid_threads())
    out[i] = from_f32<T>(f(to_f32(a[i])));
}

template <class T, class F>
__global__ void map2_kernel(T* out, const T* a, const T* b, int64_t n, bool vec, F f) {
  using P = Pack16<T>;
  const int64_t packs = vec ? n / P::kN : 0;
  for (int64_t p = global_thread(); p < packs; p += grid_threads()) {
    const P x = reinterpret_cast<const P*>(a)[p];
    const P z = reinterpret_cast<const P*>(b)[p];
    P y;
#pragma unroll
    for (int k = 0; k < P::kN; ++k) y.v[k] = from_f32<T>(f(to_f32(x.v[k]), to_f32(z.v[k])));
    reinterpret_cast<P*>(out)[p] = y;
  }
  for (int64_t i = packs * P::kN + global_thread(); i < n; i += grid_threads())
    out[i] = from_f32<T>(f(to_f32(a[i]), to_f32(b[i])));
}

// Launches map1_kernel / map2_kernel for storage T on `stream` (n > 0).
template <class T, class F>
void launch_map1(T* out, const T* a, int64_t n, F f, cudaStream_t stream) {
  const bool vec = aligned16(out) && aligned16(a);
  const int64_t work = vec ? n / Pack16<T>::kN + n % Pack16<T>::kN : n;
  map1_kernel<T, F>
      <<<grid_stride_blocks(work), kElementwiseThreads, 0, stream>>>(out, a, n, vec, f);
}
template <class T, class F>
void launch_map2(T* out, const T* a, const T* b, int64_t n, F f, cudaStream_t stream) {
  const bool vec = aligned16(out) && aligned16(a) && aligned16(b);
  const int64_t work = vec ? n / Pack16<T>::kN + n % Pack16<T>::kN : n;
  map2_kernel<T, F>
      <<<grid_stride_blocks(work), kElementwiseThreads, 0, stream>>>(out, a, b, n, vec, f);
}

// ---- reductions ------------------------------------------------------------------------------
// Column sums of a (chunks, P) fp32 partial matrix, in an order fixed by `chunks` alone (so the
// result does not depend on scheduling): a block of (32, kCombineRows) threads covers 32 columns;
// thread (x, y) sums column `col` over the chunks y, y + kCombineRows, ... in order, then thread
// (x, 0) adds the kCombineRows sums in order and returns the column's total (other threads: 0;
// col >= P: 0). `sums` is the block's [kCombineRows][33] shared array. Call from all threads.
constexpr int kCombineRows = 32;
__device__ __forceinline__ float combine_columns(const float* partial, int64_t chunks, int P,
                                                 int col, float (*sums)[33]) {
  float acc = 0.0f;
  if (col < P) {
    for (int64_t k = threadIdx.y; k < chunks; k += kCombineRows) acc += partial[k * P + col];
  }
  sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0) return 0.0f;
  float total = 0.0f;
#pragma unroll
  for (int y = 0; y < kCombineRows; ++y) total += sums[y][threadIdx.x];
  return total;
}

struct SumOp {
  template <class V>
  __device__ __forceinline__ V operator()(V a, V b) const {
    return a + b;
  }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Every lane of the warp gets the reduction of the 32 lanes' values.
template <class V, class Op>
__device__ __forceinline__ V warp_all_reduce(V v, Op op) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  return warp_all_reduce(v, SumOp{});
}
__device__ __forceinline__ float warp_max(float v) {
  return warp_all_reduce(v, MaxOp{});
}

// Every thread of the block gets the reduction of all threads' values. blockDim.x must be a
// multiple of 32; `shared` holds 32 values. Contains __syncthreads(): call from all threads.
template <class V, class Op>
__device__ V block_all_reduce(V v, Op op, V identity, V* shared) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  v = warp_all_reduce(v, op);
  __syncthreads();  // `shared` may still be read by the previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : identity;
  return warp_all_reduce(v, op);
}

}  // namespace zerod::cuda
