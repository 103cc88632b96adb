// The CUDA backend: every op of kernels/backend.h on one GPU, asynchronous on one stream owned by
// the backend (synchronize() waits for it). Compute-dtype tensors are real bf16 / fp16 (2 bytes)
// or fp32 storage, so round_to_compute() is a no-op; `float*` tensors are fp32.
//
// Pointers: tensors, tokens and targets are device memory (from allocate()). copy(),
// cast_to_compute() and cast_from_compute() also accept host memory on either side (they stage
// through device scratch and return once host memory is read / written), for CPU-side callers.
// Results match the CPU reference (kernels/cpu/) within fp32 rounding of a different
// summation order, or the one rounding of a 16-bit output; reductions are deterministic.
// CUDA / cuBLASLt failures throw zerod::Error naming the call.
#pragma once

#include <memory>

#include "kernels/backend.h"

namespace zerod {

// A backend on GPU `device` for `compute_dtype`. Throws when the device does not exist (no
// driver, no GPU, or device >= the device count).
std::unique_ptr<Backend> make_cuda_backend(DType compute_dtype, int device = 0);

}  // namespace zerod
