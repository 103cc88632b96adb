// Lamb (DeepSpeed FusedLamb) on the device, the two passes of kernels/cpu/lamb.h: fp32 master, m,
// v; gradient in the compute dtype. Each element's operations are the CPU's (lamb_moments_element,
// lamb_direction) as explicit round-to-nearest intrinsics, so with the same trust ratio the
// states agree with the CPU bit for bit; the sums of squares are in double, in another order.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/storage.h"

namespace zerod::cuda {

// The most blocks lamb_moments writes partial sums for.
constexpr int kLambMaxBlocks = 1024;

// The per-step constants, filled by the caller from cpu::lamb_constants().
struct LambStep {
  float grad_scale, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay, step_size;
  bool eps_inside_sqrt;
};

// m, v (n, fp32) updated from grad (n, compute dtype) * grad_scale; partial (2 k doubles):
// per block, the sums of master^2 and u^2; returns k (a function of n only).
int lamb_moments(Storage dt, const float* master, float* m, float* v, const void* grad, int64_t n,
                 const LambStep& k, double* partial, cudaStream_t stream);

// master (n) -= step_size * coeff * u, u from the updated m, v; param_out (n, compute dtype, may
// be null) = the new master rounded.
void lamb_apply(Storage dt, float* master, const float* m, const float* v, void* param_out,
                int64_t n, const LambStep& k, float coeff, cudaStream_t stream);

}  // namespace zerod::cuda
