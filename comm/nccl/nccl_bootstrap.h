// Creation of the NCCL communicator of one rank through the rendezvous store (comm/store.h).
//
// Store keys (each under "<prefix>/" when the prefix is not empty):
//   nccl_joined_<r>   set by rank r when it comes to creation ("1"); names the ranks that never
//                     came when creation times out
//   nccl_unique_id    NCCL's ncclUniqueId (NCCL_UNIQUE_ID_BYTES raw bytes), set by rank 0
//
// Rank 0 creates the id with ncclGetUniqueId, which needs no GPU (it opens NCCL's bootstrap
// socket), so the exchange itself runs and is tested on machines without one.
#pragma once

#include <nccl.h>

#include <chrono>
#include <string>
#include <vector>

#include "comm/nccl/nccl_communicator.h"
#include "comm/store.h"

namespace zerod::nccl_backend {

using Clock = std::chrono::steady_clock;

inline constexpr const char* kUniqueIdKey = "nccl_unique_id";

// `name` under "<prefix>/", or `name` itself when prefix is empty.
std::string nccl_store_key(const std::string& prefix, const std::string& name);
// "nccl_joined_<rank>".
std::string nccl_joined_key(int rank);

// Publishes that `rank` came, then returns the communicator's unique id: rank 0 creates and
// publishes it, the others wait for it until `deadline`. Throws Error(kPeerLost) naming rank 0
// and the key when it is not published in time, Error(kInternal) when the stored value is not an
// ncclUniqueId or NCCL cannot create one. With a `monitor`, a rank it knows to be dead ends the
// wait at once (Error(kPeerLost) naming it). `global_ranks` (a sub-group's, by group rank; empty
// for a world) names the ranks in those errors by their global ranks.
ncclUniqueId exchange_nccl_unique_id(Store& store, const std::string& prefix, int rank,
                                     Clock::time_point deadline, PeerMonitor* monitor = nullptr,
                                     const std::vector<int>& global_ranks = {});

// The whole creation for `o` (rank, size, device, store, key_prefix, timeout): the exchange
// above, then ncclCommInitRankConfig without blocking on o.device, polled until start +
// o.timeout. On timeout NCCL is aborted and Error(kPeerLost) names the ranks whose joined keys are
// missing; NCCL failures throw with nccl_error_kind. The caller checked the options and the
// device. Returns a ready, non-blocking NCCL communicator.
ncclComm_t create_nccl_comm(const NcclOptions& o, Clock::time_point start);

}  // namespace zerod::nccl_backend
