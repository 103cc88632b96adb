// Residual addition on the device. Device pointers; asynchronous on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/storage.h"

namespace zerod::cuda {

// out (n) = a + b (added in fp32, rounded once); out may alias a or b.
void residual_forward(Storage dt, void* out, const void* a, const void* b, int64_t n,
                      cudaStream_t stream);

}  // namespace zerod::cuda
