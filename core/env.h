// On/off switches and counts read from the environment (benchmark and fallback knobs such as
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

// A count from the environment variable `name` whose value is `value` (std::getenv's result,
// passed in so that callers and tests can parse any string): unset or empty gives fallback; an
// integer in [lo, hi] itself; anything else is bad input naming the variable, the value and
// `meaning` (what the count is).
inline long env_count(const char* name, const char* value, long lo, long hi, long fallback,
                      const char* meaning) {
  if (value == nullptr || *value == '\0') return fallback;
  char* end = nullptr;
  const long n = std::strtol(value, &end, 10);
  if (end == value || *end != '\0' || n < lo || n > hi) {
    ZD_THROW_INPUT("{}='{}': expected {}, {} to {} (default {})", name, value, meaning, lo, hi,
                   fallback);
  }
  return n;
}

}  // namespace zerod
