// lamb_moments: min(ceil(n/256), 1024) blocks of 256 threads, grid-stride, the two sums in double
// reduced per block. lamb_apply: grid-stride, 256 threads.
#include "kernels/cuda/cast.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/lamb.h"

namespace zerod::cuda {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float direction(float p, float m, float v, const LambStep& k) {
  const float denom =
      k.eps_inside_sqrt ? __fsqrt_rn(__fadd_rn(v, k.eps)) : __fadd_rn(__fsqrt_rn(v), k.eps);
  return __fadd_rn(__fdiv_rn(m, denom), __fmul_rn(k.weight_decay, p));
}

template <class T>
__global__ void moments_kernel(const float* master, float* m, float* v, const T* grad, int64_t n,
                               LambStep k, double* partial) {
  __shared__ double shared[32];
  double w2 = 0.0, u2 = 0.0;
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    const float p = master[i];
    const float g = __fmul_rn(to_f32(grad[i]), k.grad_scale);
    const float mi = __fadd_rn(__fmul_rn(k.beta1, m[i]), __fmul_rn(k.one_minus_beta1, g));
    const float vi =
        __fadd_rn(__fmul_rn(k.beta2, v[i]), __fmul_rn(__fmul_rn(k.one_minus_beta2, g), g));
    m[i] = mi;
    v[i] = vi;
    const float u = direction(p, mi, vi, k);
    w2 += static_cast<double>(p) * p;
    u2 += static_cast<double>(u) * u;
  }
  w2 = block_all_reduce(w2, SumOp{}, 0.0, shared);
  u2 = block_all_reduce(u2, SumOp{}, 0.0, shared);
  if (threadIdx.x == 0) {
    partial[2 * blockIdx.x] = w2;
    partial[2 * blockIdx.x + 1] = u2;
  }
}

template <class T>
__global__ void apply_kernel(float* master, const float* m, const float* v, T* param_out, int64_t n,
                             LambStep k, float scaled) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    const float p = master[i];
    const float q = __fsub_rn(p, __fmul_rn(scaled, direction(p, m[i], v[i], k)));
    master[i] = q;
    if (param_out != nullptr) param_out[i] = from_f32<T>(q);
  }
}

}  // namespace

int lamb_moments(Storage dt, const float* master, float* m, float* v, const void* grad, int64_t n,
                 const LambStep& k, double* partial, cudaStream_t stream) {
  if (n <= 0) return 0;
  const int64_t wanted = (n + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(wanted < kLambMaxBlocks ? wanted : kLambMaxBlocks);
  dispatch(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    moments_kernel<T>
        <<<blocks, kThreads, 0, stream>>>(master, m, v, static_cast<const T*>(grad), n, k, partial);
  });
  check(cudaGetLastError(), "lamb_moments kernel launch");
  return blocks;
}

void lamb_apply(Storage dt, float* master, const float* m, const float* v, void* param_out,
                int64_t n, const LambStep& k, float coeff, cudaStream_t stream) {
  if (n <= 0) return;
  const float scaled = k.step_size * coeff;  // (one fp32 multiply, as the CPU's)
  dispatch(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    apply_kernel<T><<<grid_stride_blocks(n), kElementwiseThreads, 0, stream>>>(
        master, m, v, static_cast<T*>(param_out), n, k, scaled);
  });
  check(cudaGetLastError(), "lamb_apply kernel launch");
}

}  // namespace zerod::cuda
