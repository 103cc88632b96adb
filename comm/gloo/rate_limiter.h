// A bandwidth throttle in the Gloo transport, for tests and benchmarks of slow links (a link of
// 1 Gbit/s between two processes on one machine): a token bucket without burst on the bytes one
// communicator sends. Each send of n bytes reserves n / rate seconds of link time after the
// previous reservation ends, and the sender waits until its reservation ends before posting it,
// so sending X bytes takes at least X / rate. It is a throttle inside zerod's Gloo algorithms
// (every Link::send: ring, direct, tree), not a shaped network interface: receives, Gloo's own
// algorithms (GlooAlgorithm::kGloo) and other processes' traffic are not limited, and latency is
// not added. Set with GlooOptions::rate_limit_bits_per_s or the environment variable
// ZEROD_GLOO_RATE_LIMIT_BPS (bits per second, e.g. 1e9).
#pragma once

#include <chrono>
#include <cstddef>
#include <mutex>

namespace zerod::gloo_backend {

class RateLimiter {
 public:
  explicit RateLimiter(double bits_per_second);
  // Blocks until `bytes` more bytes fit the rate (thread-safe).
  void acquire(size_t bytes);
  double bits_per_second() const { return bits_per_s_; }

 private:
  using Clock = std::chrono::steady_clock;
  double bits_per_s_;
  std::mutex mu_;
  Clock::time_point free_at_{};  // when the reserved link time ends
};

// ZEROD_GLOO_RATE_LIMIT_BPS as bits per second; 0 when unset or empty. Throws InputError naming
// the variable when it is not a positive number.
double rate_limit_from_env();

}  // namespace zerod::gloo_backend
