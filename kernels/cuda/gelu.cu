// Vectorised grid-stride maps (device_util.cuh: 16-byte packs where aligned), 256 threads per
// block.
#include "kernels/cuda/cast.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/gelu.h"

namespace zerod::cuda {

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

struct GeluForward {
  __device__ __forceinline__ float operator()(float x) const {
    const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
  }
};

// dinp = gelu'(x) * dout
struct GeluBackward {
  __device__ __forceinline__ float operator()(float x, float dout) const {
    const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
    const float t = tanhf(u);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
    const float grad = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
    return grad * dout;
  }
};

}  // namespace

void gelu_forward(Storage dt, void* out, const void* inp, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  dispatch(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_map1(static_cast<T*>(out), static_cast<const T*>(inp), n, GeluForward{}, stream);
  });
  check(cudaGetLastError(), "gelu_forward kernel launch");
}

void gelu_backward(Storage dt, void* dinp, const void* inp, const void* dout, int64_t n,
                   cudaStream_t stream) {
  if (n <= 0) return;
  dispatch(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_map2(static_cast<T*>(dinp), static_cast<const T*>(inp), static_cast<const T*>(dout), n,
                GeluBackward{}, stream);
  });
  check(cudaGetLastError(), "gelu_backward kernel launch");
}

}  // namespace zerod::cuda
