// SGD, Adagrad and Lion steps on the device: fp32 master, m, v; gradient and the optional rounded
// parameter copy in the compute dtype. Each element update is the one of kernels/cpu/optim.h
// (sgd_element, adagrad_element, lion_element) with the same IEEE operations in the same order
// (explicit round-to-nearest intrinsics, no contraction), so fp32 states match the CPU.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/storage.h"

namespace zerod::cuda {

enum class OptimKind : uint8_t { kSgd, kSgdMomentum, kSgdNesterov, kAdagrad, kLion };

// The per-step constants, filled by the caller from cpu::optim_constants() (the ones derived
// from lr and the step computed in double on the host).
struct OptimStep {
  OptimKind kind;
  bool first;  // step == 1
  float grad_scale, weight_decay;
  float neg_lr, momentum, one_minus_dampening;                  // SGD
  float neg_clr, eps, initial_value;                            // Adagrad
  float decay, beta1, one_minus_beta1, beta2, one_minus_beta2;  // Lion
};

// master, m, v (n, fp32) updated in place from grad (n, compute dtype) * grad_scale;
// param_out (n, compute dtype, may be null) = the new master rounded to the compute dtype.
void optim_update(Storage dt, float* master, float* m, float* v, const void* grad, void* param_out,
                  int64_t n, const OptimStep& k, cudaStream_t stream);

}  // namespace zerod::cuda
