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

RateLimiter::RateLimiter(double bits_per_second, int first_local, int local_ranks)
    : RateLimiter(bits_per_second) {
  ZD_CHECK(first_local >= 0 && local_ranks >= 1, "node link of ranks [{}, {})", first_local,
           first_local + local_ranks);
  first_local_ = first_local;
  local_ranks_ = local_ranks;
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

bool rate_limit_per_node_from_env() {
  const char* v = std::getenv("ZEROD_GLOO_RATE_LIMIT_SCOPE");
  if (v == nullptr || *v == '\0' || std::string(v) == "rank") return false;
  ZD_CHECK_INPUT(std::string(v) == "node",
                 "ZEROD_GLOO_RATE_LIMIT_SCOPE: '{}' is not 'rank' (each rank's sends) or 'node' "
                 "(the sends between processes, one link per process)",
                 v);
  return true;
}

std::shared_ptr<RateLimiter> make_rate_limiter(double bits_per_second, bool per_node,
                                               int first_local, int local_ranks) {
  if (!per_node) return std::make_shared<RateLimiter>(bits_per_second);
  static std::mutex mu;
  static std::weak_ptr<RateLimiter> node;
  std::lock_guard<std::mutex> lock(mu);
  std::shared_ptr<RateLimiter> l = node.lock();
  if (l) {
    ZD_CHECK(l->bits_per_second() == bits_per_second && !l->applies_to(first_local) &&
                 !l->applies_to(first_local + local_ranks - 1),
             "one node link per process: {} bits/s for ranks [{}, {}) differs from the link "
             "made first",
             bits_per_second, first_local, first_local + local_ranks);
    return l;
  }
  l = std::make_shared<RateLimiter>(bits_per_second, first_local, local_ranks);
  node = l;
  return l;
}

}  // namespace zerod::gloo_backend
