// Whole-array reductions and scaling, fp32 data.
#pragma once

#include <cstdint>

namespace zerod::cpu {

// Sum of x[i]^2 over x (n), each square and the accumulation in double. The array is split
// into fixed chunks (size independent of the thread count) whose partial sums are added in
// chunk order, so the result is bit-identical for any number of threads. Inf/NaN propagate.
double sum_squares(const float* x, int64_t n);

// x (n) *= s
void scale(float* x, float s, int64_t n);

}  // namespace zerod::cpu
