// This process's resident memory as the kernel counts it (/proc/self/status): the current
// resident set (VmRSS) and its high-water mark (VmHWM, the peak since the process started), in
// bytes; -1 where unreadable (not Linux).
#pragma once

#include <cstdint>

namespace zerod {

int64_t resident_bytes();       // VmRSS
int64_t peak_resident_bytes();  // VmHWM

}  // namespace zerod
