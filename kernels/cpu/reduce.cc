#include "kernels/cpu/reduce.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace zerod::cpu {

namespace {
constexpr int64_t kChunk = int64_t{1} << 14;  // elements per partial sum
}  // namespace

double sum_squares(const float* x, int64_t n) {
  if (n <= 0) return 0.0;
  const int64_t chunks = ceil_div(n, kChunk);
  std::vector<double> partial(static_cast<size_t>(chunks));
#pragma omp parallel for schedule(static) if (n >= kParallelMinElems)
  for (int64_t k = 0; k < chunks; ++k) {
    const float* p = x + k * kChunk;
    const int64_t len = std::min(kChunk, n - k * kChunk);
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < len; ++i) {
      const double d = p[i];
      s += d * d;
    }
    partial[static_cast<size_t>(k)] = s;
  }
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

void scale(float* x, float s, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMinElems)
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

}  // namespace zerod::cpu
