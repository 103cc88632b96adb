#include "comm/nccl/nccl_bootstrap.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "comm/nccl/cuda_handles.h"
#include "comm/nccl/nccl_error.h"
#include "comm/rank_names.h"
#include "core/error.h"

namespace zerod::nccl_backend {

namespace {

Millis remaining(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
  return std::max(left, Millis(1));
}

std::string creation_what(const NcclOptions& o, Clock::time_point start) {
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  const RankNames names{o.group_name, o.global_ranks};
  if (!names.is_world()) {
    return fmt::format(
        "creating the NCCL communicator of {} on rank {} (GPU {}) failed after {:.0f} ms "
        "(timeout {} ms)",
        names.describe_group(), names.global(o.rank), o.device, ms, o.timeout.count());
  }
  return fmt::format(
      "creating the NCCL communicator (rank {} of {}, GPU {}) failed after {:.0f} ms (timeout {} "
      "ms)",
      o.rank, o.size, o.device, ms, o.timeout.count());
}

// "ranks 1, 3 never joined (store keys 'p/nccl_joined_1', 'p/nccl_joined_3' not set)", or ""
// when every other rank published its joined key.
std::string missing_ranks(const NcclOptions& o) {
  std::vector<int> missing;
  std::vector<std::string> keys;
  for (int r = 0; r < o.size; ++r) {
    if (r == o.rank) continue;
    const std::string key = nccl_store_key(o.key_prefix, nccl_joined_key(r));
    try {
      if (!o.store->check({key})) {
        missing.push_back(RankNames{o.group_name, o.global_ranks}.global(r));
        keys.push_back("'" + key + "'");
      }
    } catch (const std::exception&) {
      // The store itself failed: the caller's message says what NCCL did.
    }
  }
  if (missing.empty()) return "";
  const char* s = missing.size() == 1 ? "" : "s";
  return fmt::format("rank{} {} never joined (store key{} {} not set)", s, fmt::join(missing, ", "),
                     s, fmt::join(keys, ", "));
}

// "rank 2 is dead (reason)" for the first rank other than `self` the monitor knows to be dead,
// "" otherwise (no monitor, or every rank alive): a dead rank will never join. `names`: the
// rank printed for each index (a sub-group's global ranks; empty: the index).
std::string dead_rank(PeerMonitor* monitor, int self, const std::vector<int>& names = {}) {
  if (monitor == nullptr) return "";
  const std::vector<RankProgress> ranks = monitor->snapshot();
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (static_cast<int>(r) == self || ranks[r].alive) continue;
    return fmt::format("rank {} is dead ({})", r < names.size() ? names[r] : static_cast<int>(r),
                       ranks[r].reason);
  }
  return "";
}

}  // namespace

std::string nccl_store_key(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "/" + name;
}

std::string nccl_joined_key(int rank) {
  return fmt::format("nccl_joined_{}", rank);
}

ncclUniqueId exchange_nccl_unique_id(Store& store, const std::string& prefix, int rank,
                                     Clock::time_point deadline, PeerMonitor* monitor,
                                     const std::vector<int>& global_ranks) {
  store.set(nccl_store_key(prefix, nccl_joined_key(rank)), Bytes{'1'});
  const std::string key = nccl_store_key(prefix, kUniqueIdKey);
  ncclUniqueId id;
  if (rank == 0) {
    nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId (rank 0 creates the communicator's id)");
    const auto* p = reinterpret_cast<const uint8_t*>(&id);
    store.set(key, Bytes(p, p + sizeof(id)));
    return id;
  }
  Bytes value;
  // Waited for in slices, so a rank known dead ends the wait (the monitor) at once.
  while (true) {
    try {
      value = store.get(key, std::min(remaining(deadline), Millis(200)));
      break;
    } catch (const Error& e) {
      const std::string dead = dead_rank(monitor, rank, global_ranks);
      const RankNames names{"", global_ranks};
      if (!dead.empty())
        ZD_THROW_KIND(ErrorKind::kPeerLost, "rank {}: waiting for the NCCL unique id: {}",
                      names.global(rank), dead);
      if (Clock::now() >= deadline)
        ZD_THROW_KIND(e.kind(), "rank {}: rank {} did not publish the NCCL unique id: {}",
                      names.global(rank), names.global(0), e.what());
    }
  }
  ZD_CHECK(value.size() == sizeof(id),
           "store key '{}' holds {} bytes, not an NCCL unique id ({} bytes); do two "
           "communicators share the key prefix?",
           key, value.size(), sizeof(id));
  std::memcpy(&id, value.data(), sizeof(id));
  return id;
}

ncclComm_t create_nccl_comm(const NcclOptions& o, Clock::time_point start) {
  const auto deadline = start + o.timeout;
  ncclUniqueId id;
  try {
    id = exchange_nccl_unique_id(*o.store, o.key_prefix, o.rank, deadline, o.monitor.get(),
                                 o.global_ranks);
  } catch (const Error& e) {
    throw Error(e.kind(), fmt::format("{}: {}", creation_what(o, start), e.what()), __FILE__,
                __LINE__);
  }

  DeviceGuard guard(o.device);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every NCCL call may return ncclInProgress: polled, so it can be aborted
  ncclComm_t comm = nullptr;
  ncclResult_t state = ncclCommInitRankConfig(&comm, o.size, id, o.rank, &config);
  auto pause = std::chrono::microseconds(100);
  while (state == ncclInProgress && comm != nullptr) {
    ncclResult_t async = ncclInProgress;
    const ncclResult_t query = ncclCommGetAsyncError(comm, &async);
    state = query != ncclSuccess ? query : async;
    if (state != ncclInProgress) break;
    if (Clock::now() >= deadline) break;
    if (const std::string dead = dead_rank(o.monitor.get(), o.rank, o.global_ranks);
        !dead.empty()) {
      ncclCommAbort(comm);
      ZD_THROW_KIND(ErrorKind::kPeerLost, "{}: {}", creation_what(o, start), dead);
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(10000));
  }
  if (state == ncclSuccess) return comm;

  const std::string reason = state == ncclInProgress
                                 ? std::string("NCCL initialization did not finish")
                                 : nccl_error_text(state, comm);
  if (comm != nullptr) ncclCommAbort(comm);
  const std::string missing = missing_ranks(o);
  if (!missing.empty()) {
    ZD_THROW_KIND(ErrorKind::kPeerLost, "{}: {}; {}", creation_what(o, start), missing, reason);
  }
  const ErrorKind kind = state == ncclInProgress ? ErrorKind::kPeerLost : nccl_error_kind(state);
  ZD_THROW_KIND(kind, "{}: every rank joined, but {}", creation_what(o, start), reason);
}

}  // namespace zerod::nccl_backend
