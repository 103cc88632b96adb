// Timing of repeated benchmark iterations: each call timed on its own, summarized by the median
// (what the code does; robust to the scheduling stalls of a shared VM) and the mean (what a user
// sees, stalls included).
#pragma once

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

namespace zerod::bench {

// Seconds per iteration.
struct Timing {
  double median = 0;
  double mean = 0;
};

inline Timing summarize(std::vector<double> t) {
  Timing out;
  if (t.empty()) return out;
  for (double x : t) out.mean += x / static_cast<double>(t.size());
  std::sort(t.begin(), t.end());
  const size_t h = t.size() / 2;
  out.median = t.size() % 2 ? t[h] : (t[h - 1] + t[h]) / 2;
  return out;
}

// Times `iters` calls of `one` individually.
template <class F>
Timing time_each(int iters, F&& one) {
  using Clock = std::chrono::steady_clock;
  std::vector<double> t;
  t.reserve(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    const auto t0 = Clock::now();
    one();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return summarize(std::move(t));
}

// Iterations that move about 256 MB of `bytes`-sized messages, at least 5 and at most 1000.
inline int iterations_for(size_t bytes) {
  return static_cast<int>(
      std::clamp<size_t>((size_t(256) << 20) / std::max<size_t>(bytes, 1), 5, 1000));
}

}  // namespace zerod::bench
