#include "comm/gloo/rate_limiter.h"

#include <cmath>
#include <cstdlib>
#include <string>
#include <thread>

#include "core/error.h"

namespace zerod::gloo_backend {

RateLimiter::RateLimiter(double bits_per_second) : bits_per_s_(bits_per_second) {
  ZD_CHECK(bits_per_second > 0, "rate limit {} bits/s", bits_per_second);
}

void RateLimiter::acquire(size_t bytes) {
  const auto cost = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(static_cast<double>(bytes) * 8.0 / bits_per_s_));
  Clock::time_point until;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = Clock::now();
    free_at_ = (free_at_ > now ? free_at_ : now) + cost;
    until = free_at_;
  }
  std::this_thread::sleep_until(until);
}

double rate_limit_from_env() {
  const char* v = std::getenv("ZEROD_GLOO_RATE_LIMIT_BPS");
  if (v == nullptr || *v == '\0') return 0.0;
  char* end = nullptr;
  const double r = std::strtod(v, &end);
  ZD_CHECK_INPUT(end != v && *end == '\0' && std::isfinite(r) && r > 0,
                 "ZEROD_GLOO_RATE_LIMIT_BPS: '{}' is not a positive number of bits per second "
                 "(e.g. 1e9 for 1 Gbit/s)",
                 v);
  return r;
}

}  // namespace zerod::gloo_backend
