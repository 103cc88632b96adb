// The bias pieces of the matmul that cuBLASLt does not do for us: a broadcast add (the fallback
// when the bias epilogue is unavailable) and the deterministic column sums of dbias.
// Device pointers; asynchronous on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/storage.h"

namespace zerod::cuda {

// out (N,OC) += bias (OC) on every row (or = bias when `overwrite`, for an empty inner dim).
void add_bias(Storage dt, void* out, const void* bias, int64_t N, int OC, bool overwrite,
              cudaStream_t stream);

// Bytes of device scratch bias_backward needs (fp32 partial column sums).
size_t bias_backward_scratch_bytes(int64_t N, int OC);

// dbias (OC) += column sums of dout (N,OC), accumulated in fp32 over fixed row chunks whose
// partials are then added in order (deterministic, no atomics).
void bias_backward(Storage dt, void* dbias, const void* dout, int64_t N, int OC, float* scratch,
                   cudaStream_t stream);

}  // namespace zerod::cuda
