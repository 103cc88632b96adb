// On/off switches read from the environment (benchmark and fallback knobs such as
// ZEROD_CPU_BF16_GEMM): unset or empty gives the default, "1" on, "0" off; any other value is
// bad input (InputError, exit code 2) naming the variable and the value.
#pragma once

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace zerod {

inline bool env_switch(const char* name, bool fallback) {
  const char* e = std::getenv(name);
  if (e == nullptr || *e == '\0') return fallback;
  if (std::strcmp(e, "1") == 0) return true;
  if (std::strcmp(e, "0") == 0) return false;
  ZD_THROW_INPUT("{}='{}': expected 0 or 1", name, e);
}

}  // namespace zerod
