// GELU with the tanh approximation on the device, fp32 math on compute-dtype storage
// (the formula of kernels/cpu/gelu.cc). Device pointers; asynchronous on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/storage.h"

namespace zerod::cuda {

// out (n) = gelu(inp); out may alias inp.
void gelu_forward(Storage dt, void* out, const void* inp, int64_t n, cudaStream_t stream);
// dinp (n) = gelu'(inp) * dout; dinp may alias dout.
void gelu_backward(Storage dt, void* dinp, const void* inp, const void* dout, int64_t n,
                   cudaStream_t stream);

}  // namespace zerod::cuda
