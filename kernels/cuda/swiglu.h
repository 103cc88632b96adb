// SwiGLU (the Llama family MLP's gated activation) on the device: fp32 math on compute-dtype
// storage. Device pointers; asynchronous on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/storage.h"

namespace zerod::cuda {

// gu (N,2I) holds gate (columns [0,I)) and up ([I,2I)) per row; out (N,I) = silu(gate) * up,
// silu(x) = x / (1 + exp(-x)). out must not overlap gu.
void swiglu_forward(Storage dt, void* out, const void* gu, int64_t N, int I, cudaStream_t stream);

// dgu (N,2I) = (dgate = dout * up * silu'(gate), dup = dout * silu(gate)) from dout (N,I) and gu;
// silu'(x) = sig(x) (1 + x (1 - sig(x))). dgu may be gu (each pair is read before it is
// written, by the same thread), not dout.
void swiglu_backward(Storage dt, void* dgu, const void* dout, const void* gu, int64_t N, int I,
                     cudaStream_t stream);

}  // namespace zerod::cuda
