// Reductions and scaling of compute-dtype vectors on the device. Device pointers; asynchronous
// on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/storage.h"

namespace zerod::cuda {

// The most partial sums sum_squares_partials() writes.
constexpr int kSumSquaresMaxBlocks = 1024;

// partial (k) = sums of squares of x (n), accumulated in double, one per block of a fixed grid;
// returns k (<= kSumSquaresMaxBlocks, a function of n only, so the caller's in-order total is
// deterministic). Inf/NaN propagate.
int sum_squares_partials(Storage dt, double* partial, const void* x, int64_t n,
                         cudaStream_t stream);

// x (n) *= s (in fp32, rounded once).
void scale(Storage dt, void* x, float s, int64_t n, cudaStream_t stream);

}  // namespace zerod::cuda
