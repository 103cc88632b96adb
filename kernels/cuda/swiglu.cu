// Grid-stride loops, 256 threads: over 16-byte packs of a row's gate / up / out columns when
// every tensor is 16-byte aligned and I is a multiple of the pack (device_util.cuh Pack16), else
// element by element over (row, column).
#include "kernels/cuda/cast.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/swiglu.h"

namespace zerod::cuda {

namespace {

__device__ __forceinline__ float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}

__device__ __forceinline__ float silu(float x) {
  return x * sigmoid(x);  // (as kernels/cpu/swiglu.cc)
}

// (dgate, dup) of one element.
__device__ __forceinline__ void swiglu_grad(float g, float u, float d, float* dg, float* du) {
  const float sg = sigmoid(g);
  const float silu_g = g * sg;
  *dg = d * u * (sg * (1.0f + g * (1.0f - sg)));
  *du = d * silu_g;
}

template <class T>
__global__ void swiglu_forward_kernel(T* out, const T* gu, int64_t N, int I, bool vec) {
  using P = Pack16<T>;
  const int64_t I2 = 2 * static_cast<int64_t>(I);
  if (vec) {
    const int per_row = I / P::kN;
    const int64_t packs = N * per_row;
    for (int64_t p = global_thread(); p < packs; p += grid_threads()) {
      const int64_t n = p / per_row;
      const int64_t col = (p - n * per_row) * P::kN;
      const T* g = gu + n * I2 + col;
      const P gp = *reinterpret_cast<const P*>(g);
      const P up = *reinterpret_cast<const P*>(g + I);
      P o;
#pragma unroll
      for (int k = 0; k < P::kN; ++k) o.v[k] = from_f32<T>(silu(to_f32(gp.v[k])) * to_f32(up.v[k]));
      *reinterpret_cast<P*>(out + n * I + col) = o;
    }
    return;
  }
  const int64_t total = N * I;
  for (int64_t idx = global_thread(); idx < total; idx += grid_threads()) {
    const int64_t n = idx / I;
    const int64_t col = idx - n * I;
    const T* g = gu + n * I2 + col;
    out[idx] = from_f32<T>(silu(to_f32(g[0])) * to_f32(g[I]));
  }
}

template <class T>
__global__ void swiglu_backward_kernel(T* dgu, const T* dout, const T* gu, int64_t N, int I,
                                       bool vec) {
  using P = Pack16<T>;
  const int64_t I2 = 2 * static_cast<int64_t>(I);
  if (vec) {
    const int per_row = I / P::kN;
    const int64_t packs = N * per_row;
    for (int64_t p = global_thread(); p < packs; p += grid_threads()) {
      const int64_t n = p / per_row;
      const int64_t col = (p - n * per_row) * P::kN;
      const T* g = gu + n * I2 + col;
      const P gp = *reinterpret_cast<const P*>(g);
      const P up = *reinterpret_cast<const P*>(g + I);
      const P dp = *reinterpret_cast<const P*>(dout + n * I + col);
      P dg, du;
#pragma unroll
      for (int k = 0; k < P::kN; ++k) {
        float a, b;
        swiglu_grad(to_f32(gp.v[k]), to_f32(up.v[k]), to_f32(dp.v[k]), &a, &b);
        dg.v[k] = from_f32<T>(a);
        du.v[k] = from_f32<T>(b);
      }
      T* d = dgu + n * I2 + col;
      *reinterpret_cast<P*>(d) = dg;
      *reinterpret_cast<P*>(d + I) = du;
    }
    return;
  }
  const int64_t total = N * I;
  for (int64_t idx = global_thread(); idx < total; idx += grid_threads()) {
    const int64_t n = idx / I;
    const int64_t col = idx - n * I;
    const T* g = gu + n * I2 + col;
    float a, b;
    swiglu_grad(to_f32(g[0]), to_f32(g[I]), to_f32(dout[idx]), &a, &b);
    T* d = dgu + n * I2 + col;
    d[0] = from_f32<T>(a);
    d[I] = from_f32<T>(b);
  }
}

// Packs when all pointers are 16-byte aligned and I is a multiple of the pack; the work items.
template <class T>
int64_t plan(int64_t N, int I, bool aligned, bool* vec) {
  *vec = aligned && I % Pack16<T>::kN == 0;
  return *vec ? N * (I / Pack16<T>::kN) : N * I;
}

}  // namespace

void swiglu_forward(Storage dt, void* out, const void* gu, int64_t N, int I, cudaStream_t stream) {
  if (N <= 0 || I <= 0) return;
  dispatch(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    bool vec = false;
    const int64_t work = plan<T>(N, I, aligned16(out) && aligned16(gu), &vec);
    swiglu_forward_kernel<T><<<grid_stride_blocks(work), kElementwiseThreads, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(gu), N, I, vec);
  });
  check(cudaGetLastError(), "swiglu_forward kernel launch");
}

void swiglu_backward(Storage dt, void* dgu, const void* dout, const void* gu, int64_t N, int I,
                     cudaStream_t stream) {
  if (N <= 0 || I <= 0) return;
  dispatch(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    bool vec = false;
    const int64_t work = plan<T>(N, I, aligned16(dgu) && aligned16(dout) && aligned16(gu), &vec);
    swiglu_backward_kernel<T><<<grid_stride_blocks(work), kElementwiseThreads, 0, stream>>>(
        static_cast<T*>(dgu), static_cast<const T*>(dout), static_cast<const T*>(gu), N, I, vec);
  });
  check(cudaGetLastError(), "swiglu_backward kernel launch");
}

}  // namespace zerod::cuda
