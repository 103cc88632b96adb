// Rounding fp32 arrays to the values of a 16-bit storage type (the CPU backend stores bf16/fp16
// tensors as fp32 values that are exactly representable in the 16-bit type). Vectorised; the
// results equal core/dtype.h's round_bf16 / round_f16 bit for bit (NaN -> quiet NaN with the
// sign kept, round to nearest even, fp16 overflow to infinity, fp16 subnormals kept).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace zerod::cpu {

// x (n) = round_bf16(x), in place.
void round_bf16_inplace(float* x, int64_t n);
// x (n) = round_f16(x), in place.
void round_f16_inplace(float* x, int64_t n);

// out (n) = in (n) rounded to `dtype` (fp32: copied). out may equal in.
void cast_round(float* out, const float* in, int64_t n, DType dtype);
// cast_round on the calling thread only (vectorised, no OpenMP region): for callers already
// inside a parallel loop (a nested region per call costs more than the rounding of a row).
void cast_round_serial(float* out, const float* in, int64_t n, DType dtype);

}  // namespace zerod::cpu
