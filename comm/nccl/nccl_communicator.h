// The NCCL backend (comm/nccl/): collectives between GPU ranks, one GPU per rank, on buffers in
// device memory (cudaMalloc'd or managed, on the rank's GPU). Ranks may be threads of one process
// (one GPU each) or processes on many machines. Built only when CUDA and NCCL are found
// (ZEROD_HAVE_CUDA and the target zerod_comm_nccl).
//
// Creation (nccl_bootstrap.h): every rank publishes "nccl_joined_<rank>" in the store, rank 0
// publishes NCCL's unique id under "nccl_unique_id" (both under "<key_prefix>/" when key_prefix is
// not empty) and the others read it; then NCCL initializes without blocking and is polled until
// `timeout`. On timeout the half-made communicator is aborted and Error(kPeerLost) names the
// ranks that never joined. No GPU, or a `device` this process does not see, is InputError.
//
// Streams: the communicator owns one communication stream on `device` (not synchronizing with the
// legacy default stream). Each collective is ordered after the work the caller had queued on its
// compute stream when it issued the collective (an event recorded there, waited on by the
// communication stream), runs on the communication stream, and records a completion event.
// Work::wait() blocks the calling thread until that event completed (as the Gloo backend, it
// returns only when the collective is done, so host code may read the result's consequences),
// rethrows the collective's error, and makes the compute stream wait for the event as well.
// Work::done() never blocks. Buffers must stay valid and unmodified until the collective is done.
//
// Timeouts and failures (nccl_watchdog.h): a collective fails when it has not finished `timeout`
// after it started on the GPU (its stream reached it), when NCCL reports an asynchronous error
// (ncclCommGetAsyncError), or on a CUDA error. The error is Error(kPeerLost) for a timeout or a
// peer/network failure, kInternal otherwise, worded as the Gloo backend's: "all_reduce #12 (1001 x
// f32, sum) failed on rank 0 of 2 after 1003 ms (timeout 1000 ms): ...; rank 1 finished
// collective #11 but did not join #12". The communicator is then broken: the NCCL communicator is
// aborted (ncclCommAbort, by a watchdog thread that also notices failures nobody waits for), the
// collectives issued after the failed one fail, and later calls throw at once. Its collective log
// (comm/collective_log.h) records every collective, and on a failure the last ones are logged.
//
// Destruction never waits for a collective: unfinished ones fail ("the communicator was
// destroyed") and NCCL is aborted. A healthy, idle communicator is finalized (ncclCommFinalize,
// waited for at most min(timeout, 10 s), aborted after) and destroyed. Recent NCCL versions may
// synchronize the ranks of one node in finalize or abort: ranks that are threads of one process
// should destroy their communicators concurrently, each on its own thread.
//
// all_to_all and send_recv are NCCL's point-to-point calls (ncclSend / ncclRecv, a rank's own
// block included) fused by ncclGroupStart / ncclGroupEnd into one operation on the communication
// stream, numbered, timed and logged like the collectives.
//
// Point-to-point messages (send_async, recv_async, p2p_async; communicator.h) are the same calls:
// each call's messages as one NCCL group on the communication stream, numbered, timed and logged
// like a collective ("send", "recv", or "p2p" for a batch of several). They run in issue order on
// the one stream, so a rank that sends to and receives from a peer at one step batches them in
// one p2p_async (else both ranks' sends could wait for receives queued behind them). NCCL carries
// no tag and checks no size: the tags are named in errors only. Like the Gloo backend's, they take
// no sequence number (negative log ids) and are not reported to the PeerMonitor. Not yet run on a
// GPU.
//
// Thread safety: issue collectives of one communicator from one thread at a time (all ranks must
// issue them in the same order anyway); works may be waited on from any thread.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/peer_monitor.h"
#include "comm/store.h"

namespace zerod {

struct NcclOptions {
  int rank = 0;
  int size = 1;
  // The CUDA device of this rank (its ordinal in this process); one rank per device.
  int device = 0;
  // Rendezvous store, shared by every rank of the communicator.
  std::shared_ptr<Store> store;
  // Namespace of this communicator's keys in `store` ("job7/tp0" -> "job7/tp0/nccl_unique_id");
  // empty: the keys themselves (a store already prefixed by the caller, as for Gloo).
  std::string key_prefix;
  // Creation timeout and the timeout of each collective.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  // The caller's compute stream on `device`: collectives start after the work queued on it when
  // they are issued, and Work::wait() makes it wait for them. nullptr: the legacy default stream.
  cudaStream_t compute_stream = nullptr;
  // Told when each collective starts and completes on the GPU; asked on errors (may be null). Its
  // ranks are this communicator's ranks (a sub-group's: a GroupPeerMonitor, comm/group_monitor.h).
  std::shared_ptr<PeerMonitor> monitor;
  // A sub-group's communicator (comm/process_groups.h, comm/nccl/nccl_groups.h): the group's name
  // and the global rank of each of its ranks (global_ranks[rank], size entries); errors and logs
  // then name the group and every rank by its global rank, as the Gloo backend's. Both empty (the
  // world's communicator): ranks are named by their own numbers.
  std::string group_name;
  std::vector<int> global_ranks;
};

std::unique_ptr<Communicator> make_nccl_communicator(const NcclOptions& options);

}  // namespace zerod
