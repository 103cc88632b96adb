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
// partials are then added in order (deterministic, no atomics). `scratch`: at least
// bias_backward_scratch_bytes(N, OC).
void bias_backward(Storage dt, void* dbias, const void* dout, int64_t N, int OC, float* scratch,
                   cudaStream_t stream);

// The vector variant of bias_backward's column sums (16-byte loads, 4 row lanes a block, chunks
// of 128 rows; where OC is a multiple of 16 / element size and dout 16-byte aligned, else the
// column-per-thread kernel): ZEROD_BIAS_GRAD_VECTOR=1 at start, or set here (tests, benches).
// Off by default until measured on a GPU. The two add in different orders (not bit for bit).
void set_bias_grad_vector(bool on);
bool bias_grad_vector();

}  // namespace zerod::cuda
