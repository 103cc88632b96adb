#include "comm/nccl/nccl_communicator.h"

#include <fmt/format.h>

#include <cstdint>
#include <functional>
#include <mutex>

#include "comm/nccl/cuda_handles.h"
#include "comm/nccl/nccl_bootstrap.h"
#include "comm/nccl/nccl_error.h"
#include "comm/nccl/nccl_types.h"
#include "comm/nccl/nccl_watchdog.h"
#include "comm/nccl/nccl_work.h"
#include "comm/rank_names.h"
#include "core/error.h"
#include "core/log.h"

namespace zerod {

namespace {

using nccl_backend::Clock;
using nccl_backend::CudaEvent;
using nccl_backend::CudaStream;
using nccl_backend::DeviceGuard;
using nccl_backend::DeviceScratch;
using nccl_backend::NcclWork;
using nccl_backend::Watchdog;

// One NCCL call of a collective: the communicator and the communication stream are its last two
// arguments.
using Launch = std::function<ncclResult_t(ncclComm_t, cudaStream_t)>;

const char* memory_type_name(cudaMemoryType t) {
  switch (t) {
    case cudaMemoryTypeUnregistered:
      return "pageable host";
    case cudaMemoryTypeHost:
      return "pinned host";
    case cudaMemoryTypeDevice:
      return "device";
    case cudaMemoryTypeManaged:
      return "managed";
  }
  return "unknown";
}

// True when [a, a + a_bytes) and [b, b + b_bytes) share a byte.
bool overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(const NcclOptions& o)
      : rank_(checked(o).rank),
        size_(o.size),
        device_(o.device),
        timeout_(o.timeout),
        compute_(o.compute_stream),
        stream_(o.device),  // these create the device's context before the rendezvous
        ready_(o.device),
        barrier_(o.device, 16) {
    ncclComm_t comm = nccl_backend::create_nccl_comm(o, Clock::now());
    const RankNames names{o.group_name, o.global_ranks};
    names_ = names;
    watchdog_ =
        Watchdog::start(comm, Watchdog::Config{rank_, size_, device_, timeout_, o.monitor, names});
    log::init();
    int version = 0;
    ncclGetVersion(&version);
    spdlog::debug("nccl communicator: {} on GPU {} (NCCL {}, timeout {} ms)",
                  names.rank_of(rank_, size_), device_, version, timeout_.count());
  }

  ~NcclCommunicator() override { watchdog_->shutdown(); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "nccl"; }
  int64_t sequence() const override { return watchdog_->sequence(); }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  const CollectiveLog* collective_log() const override { return &watchdog_->log(); }

  WorkPtr all_reduce_async(void* data, int64_t count, CommType type, ReduceOp op) override;
  WorkPtr reduce_scatter_async(const void* send, void* recv, int64_t count, CommType type,
                               ReduceOp op) override;
  WorkPtr all_gather_async(const void* send, void* recv, int64_t count, CommType type) override;
  WorkPtr broadcast_async(void* data, int64_t count, CommType type, int root) override;
  WorkPtr barrier_async() override;
  WorkPtr all_to_all_async(const void* send, void* recv, int64_t count, CommType type) override;
  WorkPtr send_recv_async(const void* send, int dst, void* recv, int src, int64_t count,
                          CommType type) override;
  WorkPtr send_async(const void* data, int64_t count, CommType type, int dst, int tag) override {
    return p2p_async({P2POp{P2POp::Kind::kSend, const_cast<void*>(data), count, type, dst, tag}});
  }
  WorkPtr recv_async(void* data, int64_t count, CommType type, int src, int tag) override {
    return p2p_async({P2POp{P2POp::Kind::kRecv, data, count, type, src, tag}});
  }
  WorkPtr p2p_async(const std::vector<P2POp>& ops) override;

 private:
  static const NcclOptions& checked(const NcclOptions& o);
  // "rank 5" (its global rank in a sub-group), or "nobody" for kNoPeer.
  std::string peer_name(int peer) const;
  // `bytes` at `p` must be device memory of this rank's GPU (or managed memory).
  void check_device_buffer(const char* op, const char* name, const void* p) const;
  // Numbers the collective, orders it after the compute stream, launches it on the
  // communication stream between its two events, and hands it to the watchdog. A failure after
  // numbering breaks the communicator and returns a failed work (its wait() throws). `message`:
  // point-to-point messages, which take no sequence number (Watchdog::number).
  WorkPtr issue(const char* op, const std::string& detail, int64_t bytes, const Launch& launch,
                bool message = false);

  const int rank_;
  const int size_;
  const int device_;
  const std::chrono::milliseconds timeout_;
  const cudaStream_t compute_;
  CudaStream stream_;      // the communication stream
  CudaEvent ready_;        // recorded on the compute stream at each issue
  DeviceScratch barrier_;  // the barrier's one-element all-reduce
  RankNames names_;
  std::mutex issue_mu_;
  std::shared_ptr<Watchdog> watchdog_;
};

const NcclOptions& NcclCommunicator::checked(const NcclOptions& o) {
  ZD_CHECK(o.size >= 1 && o.rank >= 0 && o.rank < o.size, "rank {} of a world of {} ranks", o.rank,
           o.size);
  ZD_CHECK(o.store != nullptr, "the NCCL communicator needs a store");
  ZD_CHECK(o.timeout.count() > 0, "timeout must be positive, got {} ms", o.timeout.count());
  ZD_CHECK(o.global_ranks.empty() || o.global_ranks.size() == static_cast<size_t>(o.size),
           "group '{}' of {} ranks has {} global ranks", o.group_name, o.size,
           o.global_ranks.size());
  const int gpus = nccl_backend::gpu_count();
  ZD_CHECK_INPUT(gpus > 0,
                 "rank {}: the NCCL backend needs a GPU, and this process sees none (no CUDA "
                 "driver or device; CUDA_VISIBLE_DEVICES?)",
                 o.rank);
  ZD_CHECK_INPUT(o.device >= 0 && o.device < gpus,
                 "rank {}: GPU {} does not exist: this process sees {} GPU{} (0 to {})", o.rank,
                 o.device, gpus, gpus == 1 ? "" : "s", gpus - 1);
  return o;
}

void NcclCommunicator::check_device_buffer(const char* op, const char* name, const void* p) const {
  cudaPointerAttributes attr{};
  const cudaError_t e = cudaPointerGetAttributes(&attr, p);
  if (e != cudaSuccess) {
    cudaGetLastError();
    ZD_THROW("{}: cannot tell where the {} buffer {} lives: CUDA error {}", op, name, p,
             nccl_backend::cuda_error_text(e));
  }
  ZD_CHECK(attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged,
           "{}: the {} buffer {} is {} memory; the NCCL backend needs device memory of GPU {}", op,
           name, p, memory_type_name(attr.type), device_);
  ZD_CHECK(attr.type != cudaMemoryTypeDevice || attr.device == device_,
           "{}: the {} buffer {} is on GPU {}, rank {} runs on GPU {}", op, name, p, attr.device,
           rank_, device_);
}

WorkPtr NcclCommunicator::issue(const char* op, const std::string& detail, int64_t bytes,
                                const Launch& launch, bool message) {
  std::lock_guard<std::mutex> issuing(issue_mu_);
  const int64_t seq = watchdog_->number(op, detail, bytes, message);
  auto work = std::make_shared<NcclWork>(seq, fmt::format("{} #{} ({})", op, seq, detail), device_,
                                         compute_, watchdog_);
  try {
    DeviceGuard guard(device_);
    work->create_events();
    using nccl_backend::cuda_check;
    cuda_check(cudaEventRecord(ready_.get(), compute_), "recording an event on the compute stream");
    cuda_check(cudaStreamWaitEvent(stream_.get(), ready_.get(), 0),
               "making the communication stream wait for the compute stream");
    cuda_check(cudaEventRecord(work->start_event(), stream_.get()),
               "recording its start event on the communication stream");
    watchdog_->launch([&](ncclComm_t comm) { return launch(comm, stream_.get()); },
                      Clock::now() + timeout_);
    cuda_check(cudaEventRecord(work->end_event(), stream_.get()),
               "recording its end event on the communication stream");
  } catch (const Error& e) {
    watchdog_->fail_issue(work, e.kind(), e.what());
    return work;
  } catch (const std::exception& e) {
    watchdog_->fail_issue(work, ErrorKind::kInternal, e.what());
    return work;
  }
  watchdog_->track(work);
  return work;
}

WorkPtr NcclCommunicator::all_reduce_async(void* data, int64_t count, CommType type, ReduceOp op) {
  const size_t bytes = checked_collective_bytes("all_reduce", data, data, count, type, 1);
  const ncclDataType_t dt = nccl_backend::nccl_type(type);
  const ncclRedOp_t red = nccl_backend::nccl_op(op);
  if (count > 0) check_device_buffer("all_reduce", "data", data);
  const auto n = static_cast<size_t>(count);
  return issue("all_reduce",
               fmt::format("{} x {}, {}", count, comm_type_name(type), reduce_op_name(op)),
               static_cast<int64_t>(bytes), [=](ncclComm_t comm, cudaStream_t stream) {
                 return ncclAllReduce(data, data, n, dt, red, comm, stream);
               });
}

WorkPtr NcclCommunicator::reduce_scatter_async(const void* send, void* recv, int64_t count,
                                               CommType type, ReduceOp op) {
  const size_t bytes = checked_collective_bytes("reduce_scatter", send, recv, count, type, size_);
  const ncclDataType_t dt = nccl_backend::nccl_type(type);
  const ncclRedOp_t red = nccl_backend::nccl_op(op);
  if (count > 0) {
    check_device_buffer("reduce_scatter", "send", send);
    check_device_buffer("reduce_scatter", "recv", recv);
    const void* in_place = static_cast<const uint8_t*>(send) + rank_ * bytes;
    ZD_CHECK(recv == in_place || !overlap(send, bytes * size_, recv, bytes),
             "reduce_scatter: recv overlaps send other than at send + rank * count (the in-place "
             "form)");
  }
  const auto n = static_cast<size_t>(count);
  return issue("reduce_scatter",
               fmt::format("{} x {} per rank, {}", count, comm_type_name(type), reduce_op_name(op)),
               static_cast<int64_t>(bytes) * size_, [=](ncclComm_t comm, cudaStream_t stream) {
                 return ncclReduceScatter(send, recv, n, dt, red, comm, stream);
               });
}

WorkPtr NcclCommunicator::all_gather_async(const void* send, void* recv, int64_t count,
                                           CommType type) {
  const size_t bytes = checked_collective_bytes("all_gather", send, recv, count, type, size_);
  const ncclDataType_t dt = nccl_backend::nccl_type(type);
  if (count > 0) {
    check_device_buffer("all_gather", "send", send);
    check_device_buffer("all_gather", "recv", recv);
    const void* in_place = static_cast<const uint8_t*>(recv) + rank_ * bytes;
    ZD_CHECK(send == in_place || !overlap(send, bytes, recv, bytes * size_),
             "all_gather: send overlaps recv other than at recv + rank * count (the in-place "
             "form)");
  }
  const auto n = static_cast<size_t>(count);
  return issue("all_gather", fmt::format("{} x {} per rank", count, comm_type_name(type)),
               static_cast<int64_t>(bytes) * size_, [=](ncclComm_t comm, cudaStream_t stream) {
                 return ncclAllGather(send, recv, n, dt, comm, stream);
               });
}

WorkPtr NcclCommunicator::broadcast_async(void* data, int64_t count, CommType type, int root) {
  const size_t bytes = checked_collective_bytes("broadcast", data, data, count, type, 1);
  ZD_CHECK(root >= 0 && root < size_, "broadcast: root {} outside a world of {} ranks", root,
           size_);
  const ncclDataType_t dt = nccl_backend::nccl_type(type);
  if (count > 0) check_device_buffer("broadcast", "data", data);
  const auto n = static_cast<size_t>(count);
  return issue("broadcast", fmt::format("{} x {}, root {}", count, comm_type_name(type), root),
               static_cast<int64_t>(bytes), [=](ncclComm_t comm, cudaStream_t stream) {
                 return ncclBroadcast(data, data, n, dt, root, comm, stream);
               });
}

WorkPtr NcclCommunicator::barrier_async() {
  void* flag = barrier_.get();
  return issue("barrier", fmt::format("{} ranks", size_), 0,
               [flag](ncclComm_t comm, cudaStream_t stream) {
                 return ncclAllReduce(flag, flag, 1, ncclInt32, ncclSum, comm, stream);
               });
}

// NCCL's point-to-point calls of one operation, fused by ncclGroupStart / ncclGroupEnd into one
// launch on the stream (every send and receive of the group progresses at once, so a ring cannot
// deadlock). `calls` issues them and returns the first failure; the group is closed whatever
// happens, and the result is the first failure or ncclGroupEnd's (ncclInProgress on the
// non-blocking communicator: the watchdog polls it).
template <class Calls>
ncclResult_t grouped(Calls&& calls) {
  const ncclResult_t started = ncclGroupStart();
  if (started != ncclSuccess) return started;
  const ncclResult_t issued = calls();
  const ncclResult_t ended = ncclGroupEnd();
  return issued != ncclSuccess && issued != ncclInProgress ? issued : ended;
}

// The first failure of two NCCL results (ncclInProgress is not one: a queued call).
ncclResult_t first_failure(ncclResult_t a, ncclResult_t b) {
  return a != ncclSuccess && a != ncclInProgress ? a : b;
}

WorkPtr NcclCommunicator::all_to_all_async(const void* send, void* recv, int64_t count,
                                           CommType type) {
  const size_t bytes = checked_collective_bytes("all_to_all", send, recv, count, type, size_);
  const ncclDataType_t dt = nccl_backend::nccl_type(type);
  if (count > 0) {
    check_device_buffer("all_to_all", "send", send);
    check_device_buffer("all_to_all", "recv", recv);
    check_disjoint("all_to_all", send, bytes * size_, recv, bytes * size_);
  }
  const auto n = static_cast<size_t>(count);
  const int ranks = size_;
  const int me = rank_;
  return issue("all_to_all", fmt::format("{} x {} per rank", count, comm_type_name(type)),
               static_cast<int64_t>(bytes) * size_, [=](ncclComm_t comm, cudaStream_t stream) {
                 if (n == 0) return ncclSuccess;
                 return grouped([&] {
                   ncclResult_t r = ncclSuccess;
                   // Peers from rank + 1 on (rank itself included: NCCL copies to itself), so
                   // that the ranks do not all start with rank 0.
                   for (int k = 0; k < ranks; ++k) {
                     const int p = (me + k) % ranks;
                     const int q = (me - k + ranks) % ranks;
                     r = first_failure(r, ncclSend(static_cast<const uint8_t*>(send) + p * bytes, n,
                                                   dt, p, comm, stream));
                     r = first_failure(r, ncclRecv(static_cast<uint8_t*>(recv) + q * bytes, n, dt,
                                                   q, comm, stream));
                   }
                   return r;
                 });
               });
}

std::string NcclCommunicator::peer_name(int peer) const {
  return peer == kNoPeer ? std::string("nobody") : fmt::format("rank {}", names_.global(peer));
}

WorkPtr NcclCommunicator::send_recv_async(const void* send, int dst, void* recv, int src,
                                          int64_t count, CommType type) {
  const size_t bytes = checked_send_recv_bytes(send, dst, recv, src, count, type, rank_, size_);
  const ncclDataType_t dt = nccl_backend::nccl_type(type);
  if (count > 0 && dst != kNoPeer) check_device_buffer("send_recv", "send", send);
  if (count > 0 && src != kNoPeer) check_device_buffer("send_recv", "recv", recv);
  const auto n = static_cast<size_t>(count);
  return issue("send_recv",
               fmt::format("{} x {}; to {}, from {}", count, comm_type_name(type), peer_name(dst),
                           peer_name(src)),
               static_cast<int64_t>(bytes), [=](ncclComm_t comm, cudaStream_t stream) {
                 if (n == 0 || (dst == kNoPeer && src == kNoPeer)) return ncclSuccess;
                 return grouped([&] {
                   ncclResult_t r = ncclSuccess;
                   if (dst != kNoPeer) r = ncclSend(send, n, dt, dst, comm, stream);
                   if (src != kNoPeer)
                     r = first_failure(r, ncclRecv(recv, n, dt, src, comm, stream));
                   return r;
                 });
               });
}

// Point to point: the messages as one NCCL group on the communication stream (a single message
// is a group of one), numbered, timed and logged as one operation: "send" / "recv" for one
// message, "p2p" for several (the log's bytes: the sum of the messages'). NCCL matches by order
// per pair of ranks and carries no tag, so the tags are named in errors but not checked, and a
// size mismatch is not detected (NCCL's own checks, if any, decide).
WorkPtr NcclCommunicator::p2p_async(const std::vector<P2POp>& ops) {
  size_t total = 0;
  std::string detail;
  for (const P2POp& op : ops) {
    const size_t bytes = checked_p2p_bytes(op, rank_, size_);
    nccl_backend::nccl_type(op.type);
    if (op.count > 0) check_device_buffer(p2p_kind_name(op.kind), "data", op.data);
    total += bytes;
    detail +=
        fmt::format("{}{} {} x {} {} {}, tag {}", detail.empty() ? "" : "; ",
                    p2p_kind_name(op.kind), op.count, comm_type_name(op.type),
                    op.kind == P2POp::Kind::kSend ? "to" : "from", peer_name(op.peer), op.tag);
  }
  const char* name = ops.size() == 1 ? p2p_kind_name(ops.front().kind) : "p2p";
  const std::vector<P2POp> calls = ops;
  return issue(
      name, detail, static_cast<int64_t>(total),
      [calls](ncclComm_t comm, cudaStream_t stream) {
        return grouped([&] {
          ncclResult_t r = ncclSuccess;
          for (const P2POp& op : calls) {
            if (op.count == 0) continue;
            const ncclDataType_t dt = nccl_backend::nccl_type(op.type);
            const auto n = static_cast<size_t>(op.count);
            r = first_failure(r, op.kind == P2POp::Kind::kSend
                                     ? ncclSend(op.data, n, dt, op.peer, comm, stream)
                                     : ncclRecv(op.data, n, dt, op.peer, comm, stream));
          }
          return r;
        });
      },
      /*message=*/true);
}

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(const NcclOptions& options) {
  return std::make_unique<NcclCommunicator>(options);
}

}  // namespace zerod
