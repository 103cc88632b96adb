#include "core/process_memory.h"

#include <fstream>
#include <string>

namespace zerod {

namespace {
// The kB figure of a "Name:   1234 kB" line of /proc/self/status, in bytes.
int64_t status_kb(const std::string& name) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name, 0) == 0 && line.size() > name.size() && line[name.size()] == ':')
      return std::stoll(line.substr(name.size() + 1)) * 1024;
  }
  return -1;
}
}  // namespace

int64_t resident_bytes() {
  return status_kb("VmRSS");
}
int64_t peak_resident_bytes() {
  return status_kb("VmHWM");
}

}  // namespace zerod
