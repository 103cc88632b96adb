// Grid-stride loop, 256 threads per block, one element per thread per iteration; the optimizer is
// a template parameter (no branch on it in the loop).
#include "kernels/cuda/cast.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/optim.h"

namespace zerod::cuda {

namespace {

template <class T, OptimKind kKind>
__global__ void optim_kernel(float* master, float* m, float* v, const T* grad, T* param_out,
                             int64_t n, OptimStep k) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    float p = master[i];
    float g = __fmul_rn(to_f32(grad[i]), k.grad_scale);
    if constexpr (kKind == OptimKind::kLion) {
      const float mi = m[i];
      p = __fmul_rn(p, k.decay);
      const float c = __fmaf_rn(k.one_minus_beta1, g, __fmul_rn(mi, k.beta1));
      const float s = c > 0.0f ? 1.0f : (c < 0.0f ? -1.0f : 0.0f);
      p = __fmaf_rn(k.neg_lr, s, p);
      m[i] = __fmaf_rn(k.one_minus_beta2, g, __fmul_rn(mi, k.beta2));
    } else if constexpr (kKind == OptimKind::kAdagrad) {
      g = __fmaf_rn(k.weight_decay, p, g);
      const float vv = __fmaf_rn(g, g, k.first ? k.initial_value : v[i]);
      const float denom = __fadd_rn(__fsqrt_rn(vv), k.eps);
      p = __fadd_rn(p, __fdiv_rn(__fmul_rn(k.neg_clr, g), denom));
      v[i] = vv;
    } else {  // SGD
      g = __fmaf_rn(k.weight_decay, p, g);
      if constexpr (kKind != OptimKind::kSgd) {
        const float buf =
            k.first ? g : __fmaf_rn(k.one_minus_dampening, g, __fmul_rn(m[i], k.momentum));
        m[i] = buf;
        g = kKind == OptimKind::kSgdNesterov ? __fmaf_rn(k.momentum, buf, g) : buf;
      }
      p = __fmaf_rn(k.neg_lr, g, p);
    }
    master[i] = p;
    if (param_out != nullptr) param_out[i] = from_f32<T>(p);
  }
}

template <class T, OptimKind kKind>
void launch(float* master, float* m, float* v, const void* grad, void* param_out, int64_t n,
            const OptimStep& k, cudaStream_t stream) {
  optim_kernel<T, kKind><<<grid_stride_blocks(n), kElementwiseThreads, 0, stream>>>(
      master, m, v, static_cast<const T*>(grad), static_cast<T*>(param_out), n, k);
}

}  // namespace

void optim_update(Storage dt, float* master, float* m, float* v, const void* grad, void* param_out,
                  int64_t n, const OptimStep& k, cudaStream_t stream) {
  if (n <= 0) return;
  dispatch(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    switch (k.kind) {
      case OptimKind::kSgd:
        return launch<T, OptimKind::kSgd>(master, m, v, grad, param_out, n, k, stream);
      case OptimKind::kSgdMomentum:
        return launch<T, OptimKind::kSgdMomentum>(master, m, v, grad, param_out, n, k, stream);
      case OptimKind::kSgdNesterov:
        return launch<T, OptimKind::kSgdNesterov>(master, m, v, grad, param_out, n, k, stream);
      case OptimKind::kAdagrad:
        return launch<T, OptimKind::kAdagrad>(master, m, v, grad, param_out, n, k, stream);
      case OptimKind::kLion:
        return launch<T, OptimKind::kLion>(master, m, v, grad, param_out, n, k, stream);
    }
  });
  check(cudaGetLastError(), "optim_update kernel launch");
}

}  // namespace zerod::cuda
