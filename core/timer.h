// Wall-clock timing helpers.
#pragma once

#include <chrono>

namespace zerod {

using Clock = std::chrono::steady_clock;

class Stopwatch {
 public:
  Stopwatch() : start_(Clock::now()) {}
  void restart() { start_ = Clock::now(); }
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  double millis() const { return seconds() * 1e3; }

 private:
  Clock::time_point start_;
};

}  // namespace zerod
