#include "engine/train/peak_flops.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "core/cpu_info.h"
#include "core/rng.h"
#include "core/timer.h"
#include "kernels/cpu/gemm.h"

namespace zerod {

namespace {
double cpu_clock_hz() {
  {
    std::ifstream in("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq");
    double khz = 0;
    if (in >> khz && khz > 0) return khz * 1e3;
  }
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  double best_mhz = 0, named_ghz = 0;
  while (std::getline(in, line)) {
    if (line.rfind("cpu MHz", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos)
        best_mhz = std::max(best_mhz, std::atof(line.c_str() + colon + 1));
    } else if (line.rfind("model name", 0) == 0) {
      const size_t at = line.find("@ ");
      if (at != std::string::npos) named_ghz = std::atof(line.c_str() + at + 2);
    }
  }
  if (best_mhz > 0) return best_mhz * 1e6;
  return named_ghz * 1e9;
}
}  // namespace

double cpu_hardware_peak_flops(int threads, std::string* source) {
  const CpuInfo& c = cpu_info();
  const int per_cycle = c.avx512f ? 64 : (c.avx2 && c.fma) ? 32 : 16;
  const char* unit = c.avx512f ? "AVX-512 FMA" : (c.avx2 && c.fma) ? "AVX2 FMA" : "SSE";
  const double hz = cpu_clock_hz();
  const int t = std::max(1, threads);
  if (source != nullptr) {
    *source = fmt::format("hardware: {} core{} x {:.2f} GHz x {} FLOP/cycle ({})", t,
                          t == 1 ? "" : "s", hz / 1e9, per_cycle, unit);
  }
  return hz > 0 ? t * hz * per_cycle : 0.0;
}

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
