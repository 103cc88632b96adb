// RMS normalisation over the last dimension on the device (Llama family): fp32 statistics and
// accumulation on compute-dtype storage. Device pointers; asynchronous on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/storage.h"

namespace zerod::cuda {

// rstd (N) = 1 / sqrt(mean(inp[n,:]^2) + eps) (fp32); out (N,C) = inp * rstd * weight.
// out may alias inp (each lane rereads only the elements it writes).
void rmsnorm_forward(Storage dt, void* out, float* rstd, const void* inp, const void* weight,
                     int64_t N, int C, float eps, cudaStream_t stream);

// Bytes of device scratch rmsnorm_backward needs (fp32 partial sums of dweight).
size_t rmsnorm_backward_scratch_bytes(int64_t N, int C);

// dinp (N,C) +=, dweight (C) += from dout (N,C), inp and rstd of the forward:
// with n = inp * rstd, dinp += rstd * (weight * dout - n * mean_c(weight * dout * n)),
// dweight += sum over rows of dout * n. The weight gradient is summed per fixed chunk of rows
// into `scratch`, then the chunks are added in order (no atomics, deterministic).
void rmsnorm_backward(Storage dt, void* dinp, void* dweight, const void* dout, const void* inp,
                      const void* weight, const float* rstd, int64_t N, int C, float* scratch,
                      cudaStream_t stream);

}  // namespace zerod::cuda
