#include "core/cpu_info.h"

#include <sched.h>

#include <fstream>

namespace zerod {

namespace {
CpuInfo detect() {
  CpuInfo info;
  __builtin_cpu_init();
  info.avx2 = __builtin_cpu_supports("avx2");
  info.fma = __builtin_cpu_supports("fma");
  info.avx512f = __builtin_cpu_supports("avx512f");
  info.avx512bw = __builtin_cpu_supports("avx512bw");
  info.avx512vl = __builtin_cpu_supports("avx512vl");
  info.avx512bf16 = __builtin_cpu_supports("avx512bf16");
  info.f16c = __builtin_cpu_supports("f16c");
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) info.cores = CPU_COUNT(&set);
  if (info.cores < 1) info.cores = 1;
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) info.model = line.substr(colon + 2);
      break;
    }
  }
  return info;
}
}  // namespace

const CpuInfo& cpu_info() {
  static const CpuInfo info = detect();
  return info;
}

}  // namespace zerod
