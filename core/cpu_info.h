// What the CPU this process runs on can do, and how many cores it may use.
#pragma once

#include <string>

namespace zerod {

struct CpuInfo {
  bool avx2 = false;
  bool fma = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512bf16 = false;
  bool f16c = false;
  int cores = 1;      // CPUs in this process's affinity mask
  std::string model;  // "model name" from /proc/cpuinfo, or empty
};

const CpuInfo& cpu_info();

}  // namespace zerod
