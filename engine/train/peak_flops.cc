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

double gpu_peak_flops(const std::string& name, DType dtype) {
  struct Row {
    const char* part;  // found in the device name
    double tensor16;   // dense bf16/fp16 tensor-core FLOP/s
    double fp32;       // FP32 FLOP/s (CUDA cores)
  };
  // Datasheet numbers; the first row whose part is in the name wins (PCIe before the SXM default).
  static const Row kRows[] = {
      {"H100 PCIe", 756e12, 51.2e12}, {"H100", 989.4e12, 66.9e12},  // SXM
      {"H200", 989.4e12, 66.9e12},                                  // SXM
      {"H800", 989.4e12, 66.9e12},    {"A100", 312e12, 19.5e12},
  };
  for (const Row& r : kRows) {
    if (name.find(r.part) == std::string::npos) continue;
    return dtype == DType::kF32 ? r.fp32 : r.tensor16;
  }
  return 0.0;
}

}  // namespace zerod
