// One 512-thread block per row: block max over the V real columns, block sum of exp(x - max),
// loss = log(sum) + (max - x[target]); the fused variant then rewrites the row in place (x[target]
// is read before the reductions' barriers; afterwards each thread rewrites only the columns it
// reads itself).
#include <math_constants.h>

#include "kernels/cuda/cast.h"
#include "kernels/cuda/crossentropy.h"
#include "kernels/cuda/device_util.cuh"

namespace zerod::cuda {

namespace {

constexpr int kThreads = 512;

template <class T, bool kFused>
__global__ void crossentropy_kernel(float* losses, T* logits, const int32_t* targets, int V, int Vp,
                                    float dloss) {
  __shared__ float shared[32];
  const int64_t n = blockIdx.x;
  T* x = logits + n * Vp;
  const int32_t t = targets[n];
  if (t < 0 || t >= V) {  // uniform over the block: no barrier is skipped by part of it
    const float value = t < 0 ? 0.0f : CUDART_NAN_F;
    if (threadIdx.x == 0) losses[n] = value;
    if constexpr (kFused) {
      for (int j = threadIdx.x; j < Vp; j += blockDim.x) x[j] = from_f32<T>(value);
    }
    return;
  }
  const float xt = to_f32(x[t]);
  float m = -CUDART_INF_F;
  for (int j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, to_f32(x[j]));
  m = block_all_reduce(m, MaxOp{}, -CUDART_INF_F, shared);
  float s = 0.0f;
  for (int j = threadIdx.x; j < V; j += blockDim.x) s += expf(to_f32(x[j]) - m);
  s = block_all_reduce(s, SumOp{}, 0.0f, shared);
  if (threadIdx.x == 0) losses[n] = logf(s) + (m - xt);
  if constexpr (kFused) {
    const float scale = dloss / s;
    for (int j = threadIdx.x; j < Vp; j += blockDim.x) {
      float d = 0.0f;
      if (j < V) {
        d = expf(to_f32(x[j]) - m) * scale;
        if (j == t) d -= dloss;
      }
      x[j] = from_f32<T>(d);
    }
  }
}

template <bool kFused>
void launch(Storage dt, float* losses, const void* logits, const int32_t* targets, int64_t N, int V,
            int Vp, float dloss, cudaStream_t stream) {
  if (N <= 0) return;
  dispatch(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    crossentropy_kernel<T, kFused><<<static_cast<unsigned>(N), kThreads, 0, stream>>>(
        losses, static_cast<T*>(const_cast<void*>(logits)), targets, V, Vp, dloss);
  });
  check(cudaGetLastError(),
        kFused ? "crossentropy_fused kernel launch" : "crossentropy_forward kernel launch");
}

}  // namespace

void crossentropy_forward(Storage dt, float* losses, const void* logits, const int32_t* targets,
                          int64_t N, int V, int Vp, cudaStream_t stream) {
  launch<false>(dt, losses, logits, targets, N, V, Vp, 0.0f, stream);
}

void crossentropy_fused(Storage dt, float* losses, void* logits_to_dlogits, const int32_t* targets,
                        int64_t N, int V, int Vp, float dloss, cudaStream_t stream) {
  launch<true>(dt, losses, logits_to_dlogits, targets, N, V, Vp, dloss, stream);
}

}  // namespace zerod::cuda
