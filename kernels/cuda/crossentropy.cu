// One 512-thread block per row: block max over the V real columns, block sum of exp(x - max),
// loss = log(sum) + (max - x[target]); the fused variant then rewrites the row in place (x[target]
// is read before the reductions' barriers; afterwards each thread rewrites only the columns it
// reads itself). Where rows are whole 16-byte packs (Vp a multiple of 8 for bf16/fp16, of 4 for
// fp32, logits 16-byte aligned), the max and the sum come from one pass over the row in packs
// (each thread keeps a running max and a sum rescaled when its max grows; then the block's max,
// and the block sum of each thread's sum rescaled to it), and the rewrite is a second pass in
// packs: two reads and one write of the row instead of three reads and a write.
//
// The vocabulary-parallel steps also run one 512-thread block per row of the shard: step 1 a block
// max (thread 0 then reads the target's logit), step 2 a block sum of exp(x - max), step 3 no
// reduction at all (each thread rewrites its own columns from the combined statistics).
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

template <class T, bool kFused>
__global__ void crossentropy_packed_kernel(float* losses, T* logits, const int32_t* targets, int V,
                                           int Vp, float dloss) {
  using P = Pack16<T>;
  __shared__ float shared[32];
  const int64_t n = blockIdx.x;
  T* x = logits + n * Vp;
  P* xp = reinterpret_cast<P*>(x);
  const int packs = Vp / P::kN;
  const int32_t t = targets[n];
  if (t < 0 || t >= V) {  // uniform over the block: no barrier is skipped by part of it
    const float value = t < 0 ? 0.0f : CUDART_NAN_F;
    if (threadIdx.x == 0) losses[n] = value;
    if constexpr (kFused) {
      P fill;
#pragma unroll
      for (int k = 0; k < P::kN; ++k) fill.v[k] = from_f32<T>(value);
      for (int p = threadIdx.x; p < packs; p += blockDim.x) xp[p] = fill;
    }
    return;
  }
  const float xt = to_f32(x[t]);
  float m = -CUDART_INF_F, s = 0.0f;  // this thread's running max and sum of exp(x - m)
  for (int p = threadIdx.x; p < packs; p += blockDim.x) {
    const P v = xp[p];
    const int j0 = p * P::kN;
    float vm = -CUDART_INF_F;
#pragma unroll
    for (int k = 0; k < P::kN; ++k)
      if (j0 + k < V) vm = fmaxf(vm, to_f32(v.v[k]));
    if (vm == -CUDART_INF_F) continue;  // only padding (or -inf logits): nothing to add
    if (vm > m) {
      s *= expf(m - vm);  // (0 while m is still -inf)
      m = vm;
    }
#pragma unroll
    for (int k = 0; k < P::kN; ++k)
      if (j0 + k < V) s += expf(to_f32(v.v[k]) - m);
  }
  const float bm = block_all_reduce(m, MaxOp{}, -CUDART_INF_F, shared);
  s = block_all_reduce(m == -CUDART_INF_F ? 0.0f : s * expf(m - bm), SumOp{}, 0.0f, shared);
  m = bm;
  if (threadIdx.x == 0) losses[n] = logf(s) + (m - xt);
  if constexpr (kFused) {
    const float scale = dloss / s;
    for (int p = threadIdx.x; p < packs; p += blockDim.x) {
      const P v = xp[p];
      const int j0 = p * P::kN;
      P d;
#pragma unroll
      for (int k = 0; k < P::kN; ++k) {
        const int j = j0 + k;
        float g = 0.0f;
        if (j < V) {
          g = expf(to_f32(v.v[k]) - m) * scale;
          if (j == t) g -= dloss;
        }
        d.v[k] = from_f32<T>(g);
      }
      xp[p] = d;
    }
  }
}

template <bool kFused>
void launch(Storage dt, float* losses, const void* logits, const int32_t* targets, int64_t N, int V,
            int Vp, float dloss, cudaStream_t stream) {
  if (N <= 0) return;
  dispatch(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (Vp % Pack16<T>::kN == 0 && aligned16(logits)) {
      crossentropy_packed_kernel<T, kFused><<<static_cast<unsigned>(N), kThreads, 0, stream>>>(
          losses, static_cast<T*>(const_cast<void*>(logits)), targets, V, Vp, dloss);
      return;
    }
    crossentropy_kernel<T, kFused><<<static_cast<unsigned>(N), kThreads, 0, stream>>>(
        losses, static_cast<T*>(const_cast<void*>(logits)), targets, V, Vp, dloss);
  });
  check(cudaGetLastError(),
        kFused ? "crossentropy_fused kernel launch" : "crossentropy_forward kernel launch");
}

// Step 1 of the vocabulary-parallel loss, block n on row n (see crossentropy.h).
template <class T>
__global__ void shard_stats_kernel(float* stats, const T* logits, const int32_t* targets, int64_t N,
                                   int real, int Vl, int v0) {
  __shared__ float shared[32];
  const int64_t n = blockIdx.x;
  const T* x = logits + n * Vl;
  float m = -CUDART_INF_F;
  for (int j = threadIdx.x; j < real; j += blockDim.x) m = fmaxf(m, to_f32(x[j]));
  m = block_all_reduce(m, MaxOp{}, -CUDART_INF_F, shared);
  if (threadIdx.x == 0) {
    stats[n] = m;
    const int32_t t = targets[n];
    const int64_t j = static_cast<int64_t>(t) - v0;  // the target's local column
    float xt = 0.0f;                                 // not in this shard
    if (t >= 0 && j >= 0 && j < Vl) xt = j < real ? to_f32(x[j]) : CUDART_NAN_F;  // NaN: padding
    stats[N + n] = xt;
  }
}

// Step 2, block n on row n: stats[2N + n] = sum over the real columns of exp(x - stats[n]).
template <class T>
__global__ void shard_sumexp_kernel(float* stats, const T* logits, int64_t N, int real, int Vl) {
  __shared__ float shared[32];
  const int64_t n = blockIdx.x;
  const T* x = logits + n * Vl;
  const float m = stats[n];
  float s = 0.0f;
  for (int j = threadIdx.x; j < real; j += blockDim.x) s += expf(to_f32(x[j]) - m);
  s = block_all_reduce(s, SumOp{}, 0.0f, shared);
  if (threadIdx.x == 0) stats[2 * N + n] = s;
}

// Step 3, block n on row n: the loss and the row's dlogits in place from the combined stats.
template <class T>
__global__ void shard_finish_kernel(float* losses, T* logits, const int32_t* targets,
                                    const float* stats, int64_t N, int real, int Vl, int v0,
                                    float dloss) {
  const int64_t n = blockIdx.x;
  T* x = logits + n * Vl;
  const int32_t t = targets[n];
  const int64_t jt = static_cast<int64_t>(t) - v0;  // the target's local column
  if (t < 0 || (jt >= real && jt < Vl)) {           // no loss, or a target in the padding
    const float value = t < 0 ? 0.0f : CUDART_NAN_F;
    if (threadIdx.x == 0) losses[n] = value;
    for (int j = threadIdx.x; j < Vl; j += blockDim.x) x[j] = from_f32<T>(value);
    return;
  }
  const float m = stats[n], xt = stats[N + n], s = stats[2 * N + n];
  if (threadIdx.x == 0) losses[n] = logf(s) + (m - xt);
  const float scale = dloss / s;
  for (int j = threadIdx.x; j < Vl; j += blockDim.x) {
    float d = 0.0f;
    if (j < real) {
      d = expf(to_f32(x[j]) - m) * scale;
      if (j == jt) d -= dloss;
    }
    x[j] = from_f32<T>(d);
  }
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

void crossentropy_shard_stats(Storage dt, float* stats, const void* logits, const int32_t* targets,
                              int64_t N, int real, int Vl, int v0, cudaStream_t stream) {
  if (N <= 0) return;
  dispatch(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    shard_stats_kernel<T><<<static_cast<unsigned>(N), kThreads, 0, stream>>>(
        stats, static_cast<const T*>(logits), targets, N, real, Vl, v0);
  });
  check(cudaGetLastError(), "crossentropy_shard_stats kernel launch");
}

void crossentropy_shard_sumexp(Storage dt, float* stats, const void* logits, int64_t N, int real,
                               int Vl, cudaStream_t stream) {
  if (N <= 0) return;
  dispatch(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    shard_sumexp_kernel<T><<<static_cast<unsigned>(N), kThreads, 0, stream>>>(
        stats, static_cast<const T*>(logits), N, real, Vl);
  });
  check(cudaGetLastError(), "crossentropy_shard_sumexp kernel launch");
}

void crossentropy_shard_finish(Storage dt, float* losses, void* logits_to_dlogits,
                               const int32_t* targets, const float* stats, int64_t N, int real,
                               int Vl, int v0, float dloss, cudaStream_t stream) {
  if (N <= 0) return;
  dispatch(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    shard_finish_kernel<T><<<static_cast<unsigned>(N), kThreads, 0, stream>>>(
        losses, static_cast<T*>(logits_to_dlogits), targets, stats, N, real, Vl, v0, dloss);
  });
  check(cudaGetLastError(), "crossentropy_shard_finish kernel launch");
}

}  // namespace zerod::cuda
