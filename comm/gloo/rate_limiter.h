// A bandwidth throttle in the Gloo transport, for tests and benchmarks of slow links (a link of
// 1 Gbit/s between two processes on one machine): a token bucket without burst on the bytes one
// communicator sends. Each send of n bytes reserves n / rate seconds of link time after the
// previous reservation ends, and the sender waits until its reservation ends before posting it,
// so sending X bytes takes at least X / rate. It is a throttle inside zerod's Gloo algorithms
// (every Link::send: ring, direct, tree), not a shaped network interface: receives, Gloo's own
// algorithms (GlooAlgorithm::kGloo) and other processes' traffic are not limited, and latency is
// not added. Set with GlooOptions::rate_limit_bits_per_s or the environment variable
// ZEROD_GLOO_RATE_LIMIT_BPS (bits per second, e.g. 1e9).
//
// Scope (ZEROD_GLOO_RATE_LIMIT_SCOPE): "rank" (the default) paces each rank's sends to every
// peer, one bucket per communicator. "node" models one network link per process (a "node" of
// `zerod train --nnodes N --nproc-per-node R` on one machine): one bucket shared by all the
// process's ranks and communicators, pacing only sends to ranks of other processes; sends
// between the process's own ranks are not limited. Nodes' uplinks are then limited, as an
// Ethernet NIC limits a node's outgoing traffic; a switch's limits, incoming traffic and
// latency are not modelled.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>

namespace zerod::gloo_backend {

class RateLimiter {
 public:
  explicit RateLimiter(double bits_per_second);
  // A node's link: sends to global ranks in [first_local, first_local + local_ranks) (the
  // process's own) are not paced.
  RateLimiter(double bits_per_second, int first_local, int local_ranks);
  // Whether a send to `global_peer` is paced.
  bool applies_to(int global_peer) const {
    return global_peer < first_local_ || global_peer >= first_local_ + local_ranks_;
  }
  // Blocks until `bytes` more bytes fit the rate (thread-safe).
  void acquire(size_t bytes);
  double bits_per_second() const { return bits_per_s_; }

 private:
  using Clock = std::chrono::steady_clock;
  double bits_per_s_;
  int first_local_ = 0, local_ranks_ = 0;  // local_ranks_ 0: every peer is paced
  std::mutex mu_;
  Clock::time_point free_at_{};  // when the reserved link time ends
};

// ZEROD_GLOO_RATE_LIMIT_BPS as bits per second; 0 when unset or empty. Throws InputError naming
// the variable when it is not a positive number.
double rate_limit_from_env();

// ZEROD_GLOO_RATE_LIMIT_SCOPE is "node" (true), "rank", unset or empty (false); anything else is
// an InputError naming the variable.
bool rate_limit_per_node_from_env();

// The limiter of a communicator of the process whose ranks are [first_local, first_local +
// local_ranks): per_node, the process's one node link at `bits_per_second` (made once, shared
// by every communicator of the process; a different rate or range is an error); else a bucket of
// its own for every peer.
std::shared_ptr<RateLimiter> make_rate_limiter(double bits_per_second, bool per_node,
                                               int first_local, int local_ranks);

}  // namespace zerod::gloo_backend
