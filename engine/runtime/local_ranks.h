// Local ranks as threads of one process (DESIGN.md section 4): each thread gets its global
// rank, a share of the CPU cores for its kernels (cores / local ranks OpenMP threads, so ranks
// do not oversubscribe the machine), a log prefix, and its own communicator bootstrapped
// through the rendezvous store. Ranks talk only through their communicators.
//
// When a rank throws, it is marked dead in the peer monitor and its communicator is destroyed,
// which breaks the connections its peers are waiting on, so every other rank fails promptly
// instead of hanging. run_local_ranks then rethrows the root cause: the first error that is not
// a consequence of a lost peer (kPeerLost), else the first error.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "comm/peer_monitor.h"
#include "comm/store.h"
#include "engine/runtime/rank_context.h"

namespace zerod {

struct LocalRanksOptions {
  int world_size = 1;
  int first_rank = 0;                    // global rank of local rank 0
  int local_world_size = 1;              // threads to run
  std::shared_ptr<Store> store;          // required when world_size > 1
  std::shared_ptr<PeerMonitor> monitor;  // may be null (then one for the local ranks is made)
  std::string bind_address = "127.0.0.1";
  std::chrono::milliseconds timeout{300000};  // collective and bootstrap timeout
  int local_processes = 1;                    // zerod processes on this machine (RankContext)
  int local_process = 0;                      // this one's index among them
  int threads_per_rank = 0;           // OpenMP threads of each rank; 0: cores / local ranks (>= 1)
  std::string store_prefix = "comm";  // namespace of this run's communicator keys
};

void run_local_ranks(const LocalRanksOptions& options,
                     const std::function<void(const RankContext&)>& body);

}  // namespace zerod
