#include "engine/train/peak_flops.h"

#include <algorithm>
#include <vector>

#include "core/rng.h"
#include "core/timer.h"
#include "kernels/cpu/gemm.h"

namespace zerod {

double measure_cpu_peak_flops() {
  constexpr int n = 1024;
  std::vector<float> a(size_t{n} * n), b(size_t{n} * n), c(size_t{n} * n);
  fill_normal(a.data(), n * n, 0, 1, 1, 0);
  fill_normal(b.data(), n * n, 0, 1, 1, 1);
  double best = 1e30;
  for (int i = 0; i < 6; ++i) {
    Stopwatch sw;
    cpu::sgemm(false, true, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    if (i > 0) best = std::min(best, sw.seconds());  // first run warms caches and threads
  }
  return 2.0 * n * n * n / best;
}

}  // namespace zerod
