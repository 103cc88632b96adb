// CUDA twins of kernels/cpu/cast.h: fp32 <-> bf16 / fp16 conversions on the device, round to
// nearest even, NaN kept NaN, overflow to infinity (fp16) exactly like core/dtype.h.
// The first piece of the CUDA backend; the rest of kernels/backend.h follows the same pattern.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace zerod::cuda {

// GPUs visible to this process (0 when there is no driver or no device; never throws).
int device_count();

// out (n) = in (n) rounded to bf16 / fp16 bits. Device pointers; asynchronous on `stream`.
void cast_f32_to_bf16(uint16_t* out, const float* in, int64_t n, cudaStream_t stream = nullptr);
void cast_f32_to_f16(uint16_t* out, const float* in, int64_t n, cudaStream_t stream = nullptr);
// out (n) = in (n) widened to fp32.
void cast_bf16_to_f32(float* out, const uint16_t* in, int64_t n, cudaStream_t stream = nullptr);
void cast_f16_to_f32(float* out, const uint16_t* in, int64_t n, cudaStream_t stream = nullptr);

// Throws zerod::Error naming the call when a CUDA runtime call failed.
void check(cudaError_t status, const char* what);

}  // namespace zerod::cuda
