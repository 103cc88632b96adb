// The Gloo backend (comm/gloo/): collectives between CPU ranks over TCP, through Gloo
// (Debian libgloo-dev). Ranks may be threads of one process or processes on many machines.
//
// Creation connects every pair of ranks (Gloo's connectFullMesh): each rank publishes its
// listening addresses under the caller's store and connects to every other rank. It throws
// Error(kPeerLost) naming the ranks that never published their keys within the timeout. It also
// sets SIGPIPE to ignored if it is at its default: Gloo's writes to a peer that died would
// otherwise kill this process with SIGPIPE instead of failing the collective.
//
// Collectives run one at a time in issue order on one communication thread per communicator
// (Gloo contexts are not safe for concurrent collectives; the thread lets communication overlap
// compute). A caller that waits for a collective that has not started while nothing else runs
// runs it itself, which spares the plain (synchronous) forms two thread hand-offs.
//
// Each collective waits at most `timeout` from the moment it starts. A failed collective
// (timeout, or a peer whose connection closed: its process died or its communicator was
// destroyed) throws Error(kPeerLost) naming the operation, its sequence number, its size, the
// peer rank involved and, from the PeerMonitor, the ranks that had not arrived. The failing
// rank then closes all its connections, so its peers fail within moments instead of waiting
// out their timeouts, and the communicator stays broken: later calls throw at once. The
// destructor never waits for peers: collectives still queued or running fail at once (except
// with GlooAlgorithm::kGloo, whose waits inside Gloo cannot be cut short).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/peer_monitor.h"
#include "comm/store.h"

namespace zerod {

// Which algorithms the Gloo backend uses for all-reduce, reduce-scatter and all-gather
// (broadcast is always a binomial tree, barrier a dissemination barrier, all-to-all and
// send_recv one round of direct sends). Measurements and the thresholds of kAuto are in
// comm/gloo/gloo_communicator.cc.
enum class GlooAlgorithm : uint8_t {
  kAuto,    // ranks in one process: shared memory from 64 KB (unless ZEROD_GLOO_SHARED=0 or a
            // rate limit); else direct sends for small sizes (up to 4 MB with 2 ranks), the ring
            // above (default)
  kRing,    // always our pipelined ring
  kDirect,  // always one round of direct sends (least latency; scratch memory of n copies)
  kGloo,    // Gloo's options API (gloo::allreduce, gloo::allgather); reduce-scatter is then
            // an all-reduce plus a copy, as Gloo has no reduce-scatter in that API
  kShared,  // ranks that are threads of one process read each other's buffers (shared.cc);
            // creation fails when a rank is in another process
};

const char* gloo_algorithm_name(GlooAlgorithm a);
// "auto", "ring", "direct", "gloo", "shared"; throws InputError otherwise.
GlooAlgorithm parse_gloo_algorithm(const std::string& name);

struct GlooOptions {
  int rank = 0;
  int size = 1;
  // Rendezvous store, already prefixed by the caller for this communicator (Gloo's keys are
  // "rank_<r>" and "<r>").
  std::shared_ptr<Store> store;
  // The address this rank listens on; peers connect to it.
  std::string bind_address = "127.0.0.1";
  // Creation timeout and the timeout of each collective.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  // Told when each collective starts and completes; asked on errors (may be null). Its ranks are
  // this communicator's ranks (for a sub-group: a GroupPeerMonitor, comm/group_monitor.h).
  std::shared_ptr<PeerMonitor> monitor;
  // A sub-group's communicator (comm/process_groups.h): the group's name ("tensor") and the
  // global rank of each of its ranks (global_ranks[rank], size entries). Its errors and logs then
  // name the group and each rank by its global rank ("all_reduce #3 (...) failed on rank 5 of
  // group 'tensor' (global ranks 4, 5) ...; rank 4 is dead (...)"). Both empty (the world's
  // communicator): ranks are named by their own numbers.
  std::string group_name;
  std::vector<int> global_ranks;

  // For benchmarks and tests; the defaults are what training uses.
  GlooAlgorithm algorithm = GlooAlgorithm::kAuto;
  size_t segment_bytes = 0;  // ring pipeline segment (0: automatic)
  // A throttle on the bytes this rank sends (comm/gloo/rate_limiter.h: a token bucket in the
  // transport, not a shaped interface), in bits per second; 0: the environment variable
  // ZEROD_GLOO_RATE_LIMIT_BPS when set, else none. For tests and benchmarks of slow links.
  double rate_limit_bits_per_s = 0;
  // This process's ranks, global [first_local_rank, first_local_rank + local_ranks): what
  // ZEROD_GLOO_RATE_LIMIT_SCOPE=node leaves unthrottled (rate_limiter.h). 0 ranks: this rank only.
  int first_local_rank = 0;
  int local_ranks = 0;
};

std::unique_ptr<Communicator> make_gloo_communicator(const GlooOptions& options);

}  // namespace zerod
