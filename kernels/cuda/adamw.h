// AdamW / Adam (L2) step on the device: fp32 master, m, v; gradient and the optional rounded
// parameter copy in the compute dtype. The element update is adamw_element() of
// kernels/cpu/adamw.h with the same IEEE operations in the same order (explicit round-to-nearest
// intrinsics, no contraction), so fp32 states match the CPU reference bit for bit.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/storage.h"

namespace zerod::cuda {

// The per-step constants, filled by the caller from cpu::adamw_constants() (bias corrections
// computed in double on the host).
struct AdamWStep {
  float neg_lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay, grad_scale;
  float bias_correction1;       // 1 - beta1^step (or 1)
  float sqrt_bias_correction2;  // sqrt(1 - beta2^step) (or 1)
  bool l2_decay;                // decay added to the gradient (Adam mode)
  bool decoupled_decay;         // decay added to the update (AdamW mode)
};

// master, m, v (n, fp32) updated in place from grad (n, compute dtype) * grad_scale;
// param_out (n, compute dtype, may be null) = the new master rounded to the compute dtype.
void adamw_update(Storage dt, float* master, float* m, float* v, const void* grad, void* param_out,
                  int64_t n, const AdamWStep& k, cudaStream_t stream);

}  // namespace zerod::cuda
