// Grid-stride loop, 256 threads per block, one element per thread per iteration; the decay mode
// is a template parameter (no branch in the loop).
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/cast.h"
#include "kernels/cuda/device_util.cuh"

namespace zerod::cuda {

namespace {

template <class T, bool kL2, bool kDecoupled>
__global__ void adamw_kernel(float* master, float* m, float* v, const T* grad, T* param_out,
                             int64_t n, AdamWStep k) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    float p = master[i];
    float g = __fmul_rn(to_f32(grad[i]), k.grad_scale);
    if constexpr (kL2) g = __fmaf_rn(k.weight_decay, p, g);
    const float mm = __fmaf_rn(k.beta1, m[i], __fmul_rn(k.one_minus_beta1, g));
    const float vv = __fmaf_rn(k.beta2, v[i], __fmul_rn(__fmul_rn(k.one_minus_beta2, g), g));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vv), k.sqrt_bias_correction2), k.eps);
    float update = __fdiv_rn(__fdiv_rn(mm, k.bias_correction1), denom);
    if constexpr (kDecoupled) update = __fmaf_rn(k.weight_decay, p, update);
    p = __fmaf_rn(k.neg_lr, update, p);
    master[i] = p;
    m[i] = mm;
    v[i] = vv;
    if (param_out != nullptr) param_out[i] = from_f32<T>(p);
  }
}

template <class T, bool kL2, bool kDecoupled>
void launch(float* master, float* m, float* v, const void* grad, void* param_out, int64_t n,
            const AdamWStep& k, cudaStream_t stream) {
  adamw_kernel<T, kL2, kDecoupled><<<grid_stride_blocks(n), kElementwiseThreads, 0, stream>>>(
      master, m, v, static_cast<const T*>(grad), static_cast<T*>(param_out), n, k);
}

}  // namespace

void adamw_update(Storage dt, float* master, float* m, float* v, const void* grad, void* param_out,
                  int64_t n, const AdamWStep& k, cudaStream_t stream) {
  if (n <= 0) return;
  dispatch(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (k.l2_decay) {
      launch<T, true, false>(master, m, v, grad, param_out, n, k, stream);
    } else if (k.decoupled_decay) {
      launch<T, false, true>(master, m, v, grad, param_out, n, k, stream);
    } else {
      launch<T, false, false>(master, m, v, grad, param_out, n, k, stream);
    }
  });
  check(cudaGetLastError(), "adamw_update kernel launch");
}

}  // namespace zerod::cuda
