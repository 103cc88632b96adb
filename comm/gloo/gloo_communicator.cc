#include "comm/gloo/gloo_communicator.h"

#include <gloo/rendezvous/context.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "comm/gloo/algorithms.h"
#include "comm/gloo/connect.h"
#include "comm/gloo/executor.h"
#include "comm/gloo/link.h"
#include "comm/gloo/shared_group.h"
#include "core/error.h"
#include "core/log.h"

namespace zerod {

// ---------------------------------------------------------------------------------------------
// Algorithm choice (GlooAlgorithm::kAuto), from measurements on the 2-core development VM,
// 2 processes on 127.0.0.1: tools/bench/comm_bench.cc for ours and Gloo's options API (busbw,
// GB/s, median iteration), and a throw-away probe for Gloo's algorithm classes (each class and
// size in a fresh pair of processes, so that no earlier small collective shrinks SO_SNDBUF, see
// algorithms.h; mean of the best of 3 blocks). The VM is shared with other work: single numbers
// move by +-20% between runs.
//
// clang-format off
//               | all-reduce                    | reduce-scatter          | all-gather
//   size   tcp2 | ring dir  opts cl-HD cl-Ring  | ring dir  opts* cl-HD   | ring dir  opts cl-Ring
//   4K     0.11 | .028 .043 .022 .027 .048      | .020 .023 .011 .022     | .022 .023 .021 .027
//   64K    1.22 | .404 .645 .351 .370 .553      | .324 .337 .150 .313     | .331 .337 .285 .346
//   1M     2.54 | 1.65 1.15 1.74 1.58 0.89      | 1.27 1.14 0.56 0.99     | 1.42 1.30 1.47 1.98
//   16M    1.65 | 1.15 1.15 1.17 1.35 0.92      | 0.96 1.02 0.48 0.72     | 1.46 1.16 1.53 1.18
//   256M   1.69 | 1.31 1.41 1.27 1.27 1.11      | 1.16 1.30 0.53 0.95     | 1.45 1.39 1.15 1.34
// clang-format on
//
//   tcp2: a plain TCP stream both ways at once, per direction (the bound for a collective whose
//   ranks send and receive at once). ring, dir: ours (GlooAlgorithm::kRing, kDirect). opts:
//   gloo::allreduce / gloo::allgather (options API); opts*: Gloo has no reduce-scatter there,
//   so an all-reduce and a copy. cl-*: Gloo's classes AllreduceHalvingDoubling, AllreduceRing,
//   ReduceScatterHalvingDoubling (plus the copy of the const input it reduces in place),
//   AllgatherRing; constructed once, outside the timing (ours take any pointers per call).
//
// Reading: up to ~64 KB one round of messages wins (direct, and Gloo's AllreduceRing, which with
// 2 ranks sends one message each way); rings pay a round per step. From 16 MB our ring and
// direct paths, Gloo's options all-reduce and its all-reduce classes land within the noise of
// each other for all-reduce (70-83% of tcp2 for ours); for reduce-scatter ours beat Gloo's
// (58-77% of tcp2 against 44-56% for the halving-doubling class and ~30% for the options API);
// the reduction's memory traffic is what keeps reduce-scatter under all-gather on 2 cores (with
// the reduction switched off, the same transfers ran at 69-76% of tcp2). Between 512 KB and 8 MB
// direct and ring are within the noise for 2 ranks; direct saves rounds, the ring saves scratch
// memory (direct keeps n copies) and, with more ranks, bytes.
// ---------------------------------------------------------------------------------------------
namespace {

// Argument check of the reductions: CPU ranks hold fp32; 16-bit floats are not reduced here.
void check_reducible(const char* op, CommType type) {
  ZD_CHECK(type != CommType::kBF16 && type != CommType::kF16,
           "{}: the Gloo backend does not reduce {} (CPU ranks keep compute tensors in fp32)", op,
           comm_type_name(type));
}

// Largest all-reduce (bytes) done with one round of direct sends rather than the ring. With 2
// ranks both move the same bytes and direct saves a round; with more, direct moves n/2 times
// the bytes of the ring, so only latency-bound sizes go direct.
size_t direct_all_reduce_max(int n) {
  return n == 2 ? (4 << 20) : (64 << 10);
}
// Largest reduce-scatter / all-gather (bytes per rank) done with direct sends: the same bytes as
// the ring in one round instead of n-1, but (reduce-scatter) n times the bytes in scratch memory
// and no overlap of reduction and transfer.
size_t direct_scatter_gather_max(int n) {
  return n == 2 ? (2 << 20) : (256 << 10);
}
// Smallest collective (bytes per rank) that ranks in one process move through shared memory:
// below it, one round of direct messages costs less than the shared path's two or three rounds
// of tiny ones.
constexpr size_t kSharedMin = 64 << 10;

using gloo_backend::Link;

// The Communicator over an Executor: checks arguments, picks the algorithm, names the
// collective. Scratch memory is touched by one collective at a time (the executor runs one at a
// time), on whichever thread runs it.
class GlooCommunicator final : public Communicator {
 public:
  explicit GlooCommunicator(const GlooOptions& options)
      : rank_(options.rank),
        size_(options.size),
        timeout_(options.timeout),
        algorithm_(options.algorithm) {
    tuning_.segment_bytes = options.segment_bytes;
    context_ = gloo_backend::connect_full_mesh(options);
    names_ = RankNames{options.group_name, options.global_ranks};
    const std::string who = names_.rank_of(rank_, size_);
    executor_ = gloo_backend::Executor::start(context_, timeout_, options.monitor, names_);
    const double rate = options.rate_limit_bits_per_s > 0 ? options.rate_limit_bits_per_s
                                                          : gloo_backend::rate_limit_from_env();
    // Ranks in this process share memory (a throttled link stays a link: not then).
    if (size_ > 1 && (algorithm_ == GlooAlgorithm::kAuto || algorithm_ == GlooAlgorithm::kShared)) {
      // (Joined whatever the settings below, so that ranks whose environments differ never wait
      // for each other's keys.)
      // (Kept even when unused: rank 0's reference keeps the group alive for the others to join.)
      joined_ = gloo_backend::join_shared_group(*options.store, rank_, size_, timeout_);
      shared_ = joined_;
      const char* off = std::getenv("ZEROD_GLOO_SHARED");
      if (algorithm_ == GlooAlgorithm::kAuto && (rate > 0 || (off && std::string(off) == "0")))
        shared_ = nullptr;
    }
    ZD_CHECK(algorithm_ != GlooAlgorithm::kShared || size_ == 1 || shared_ != nullptr,
             "Gloo algorithm 'shared': {} has a peer in another process", who);
    if (rate > 0) {
      const bool per_node = gloo_backend::rate_limit_per_node_from_env();
      const int first = options.local_ranks > 0 ? options.first_local_rank : names_.global(rank_);
      executor_->set_rate_limiter(
          gloo_backend::make_rate_limiter(rate, per_node, first, std::max(1, options.local_ranks)));
    }
    log::init();
    spdlog::debug("gloo communicator: {} connected on {} (timeout {} ms)", who,
                  options.bind_address, timeout_.count());
  }

  // Queued collectives fail, a running one is aborted; then the connections close (peers
  // blocked on this rank see them close) and Gloo's event loop stops.
  ~GlooCommunicator() override { executor_->shutdown(); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "gloo"; }
  int64_t sequence() const override { return executor_->sequence(); }
  const CollectiveLog* collective_log() const override { return &executor_->log(); }
  std::chrono::milliseconds timeout() const override { return timeout_; }

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
    return post(P2POp{P2POp::Kind::kSend, const_cast<void*>(data), count, type, dst, tag});
  }
  WorkPtr recv_async(void* data, int64_t count, CommType type, int src, int tag) override {
    return post(P2POp{P2POp::Kind::kRecv, data, count, type, src, tag});
  }

 private:
  // A point-to-point message (comm/gloo/p2p.h), posted at once outside the collectives' queue.
  WorkPtr post(const P2POp& op) {
    const size_t bytes = checked_p2p_bytes(op, rank_, size_);
    return executor_->post_p2p(op, bytes,
                               fmt::format("{} x {}", op.count, comm_type_name(op.type)));
  }
  // `bytes`: the collective's size as the TCP thresholds count it; `per_rank`: what each rank
  // reduces or copies of its peers' (the shared-memory threshold).
  GlooAlgorithm choose(size_t bytes, size_t direct_max, size_t per_rank) const;
  // "rank 5" (its global rank in a sub-group), or "nobody" for kNoPeer.
  std::string peer_name(int peer) const;

  const int rank_;
  const int size_;
  const std::chrono::milliseconds timeout_;
  const GlooAlgorithm algorithm_;
  gloo_backend::Tuning tuning_;
  RankNames names_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::shared_ptr<gloo_backend::SharedGroup> joined_;  // every rank in this process (else null)
  std::shared_ptr<gloo_backend::SharedGroup> shared_;  // joined_, when the collectives use it
  gloo_backend::Scratch scratch_;
  std::shared_ptr<gloo_backend::Executor> executor_;
};

GlooAlgorithm GlooCommunicator::choose(size_t bytes, size_t direct_max, size_t per_rank) const {
  if (algorithm_ != GlooAlgorithm::kAuto) return algorithm_;
  const GlooAlgorithm tcp = bytes <= direct_max ? GlooAlgorithm::kDirect : GlooAlgorithm::kRing;
  // Shared memory reduces as the ring does, so it replaces the ring (ranks in one process get
  // the bits of ranks in separate ones), and with 2 ranks the direct exchange too (both orders
  // give the same sums then).
  if (shared_ && per_rank >= kSharedMin && (tcp == GlooAlgorithm::kRing || size_ == 2))
    return GlooAlgorithm::kShared;
  return tcp;
}

WorkPtr GlooCommunicator::all_reduce_async(void* data, int64_t count, CommType type, ReduceOp op) {
  checked_collective_bytes("all_reduce", data, data, count, type, 1);
  check_reducible("all_reduce", type);
  reduce_op_name(op);
  const auto n = static_cast<size_t>(count);
  return executor_->submit(
      "all_reduce", fmt::format("{} x {}, {}", count, comm_type_name(type), reduce_op_name(op)),
      count * static_cast<int64_t>(comm_type_size(type)), [this, data, n, type, op](Link& link) {
        const size_t bytes = n * comm_type_size(type);
        switch (choose(bytes, direct_all_reduce_max(size_), bytes / size_)) {
          case GlooAlgorithm::kShared:
            gloo_backend::shared_all_reduce(link, *shared_, scratch_, data, n, type, op);
            break;
          case GlooAlgorithm::kDirect:
            gloo_backend::direct_all_reduce(link, scratch_, data, n, type, op);
            break;
          case GlooAlgorithm::kGloo:
            gloo_backend::gloo_all_reduce(context_, data, n, type, op, link.tag(),
                                          link.remaining());
            break;
          default:
            gloo_backend::ring_all_reduce(link, scratch_, data, n, type, op, tuning_);
        }
      });
}

WorkPtr GlooCommunicator::reduce_scatter_async(const void* send, void* recv, int64_t count,
                                               CommType type, ReduceOp op) {
  checked_collective_bytes("reduce_scatter", send, recv, count, type, size_);
  check_reducible("reduce_scatter", type);
  reduce_op_name(op);
  const auto n = static_cast<size_t>(count);
  return executor_->submit(
      "reduce_scatter",
      fmt::format("{} x {} per rank, {}", count, comm_type_name(type), reduce_op_name(op)),
      count * size_ * static_cast<int64_t>(comm_type_size(type)),
      [this, send, recv, n, type, op](Link& link) {
        const size_t elem = comm_type_size(type);
        switch (choose(n * elem, direct_scatter_gather_max(size_), n * elem)) {
          case GlooAlgorithm::kShared:
            gloo_backend::shared_reduce_scatter(link, *shared_, scratch_, send, recv, n, type, op);
            break;
          case GlooAlgorithm::kDirect:
            gloo_backend::direct_reduce_scatter(link, scratch_, send, recv, n, type, op);
            break;
          case GlooAlgorithm::kGloo: {
            // Gloo's options API has no reduce-scatter: all-reduce a copy, keep our slice.
            if (n == 0) break;
            uint8_t* copy = scratch_.get(n * elem * size_);
            std::memcpy(copy, send, n * elem * size_);
            gloo_backend::gloo_all_reduce(context_, copy, n * size_, type, op, link.tag(),
                                          link.remaining());
            std::memmove(recv, copy + rank_ * n * elem, n * elem);
            break;
          }
          default:
            gloo_backend::ring_reduce_scatter(link, scratch_, send, recv, n, type, op, tuning_);
        }
      });
}

WorkPtr GlooCommunicator::all_gather_async(const void* send, void* recv, int64_t count,
                                           CommType type) {
  checked_collective_bytes("all_gather", send, recv, count, type, size_);
  const size_t bytes = static_cast<size_t>(count) * comm_type_size(type);
  return executor_->submit(
      "all_gather", fmt::format("{} x {} per rank", count, comm_type_name(type)),
      static_cast<int64_t>(bytes) * size_, [this, send, recv, bytes](Link& link) {
        switch (choose(bytes, direct_scatter_gather_max(size_), bytes)) {
          case GlooAlgorithm::kShared:
            gloo_backend::shared_all_gather(link, *shared_, send, recv, bytes);
            break;
          case GlooAlgorithm::kDirect:
            gloo_backend::direct_all_gather(link, send, recv, bytes);
            break;
          case GlooAlgorithm::kGloo:
            gloo_backend::gloo_all_gather(context_, send, recv, bytes, link.tag(),
                                          link.remaining());
            break;
          default:
            gloo_backend::ring_all_gather(link, send, recv, bytes, tuning_);
        }
      });
}

WorkPtr GlooCommunicator::broadcast_async(void* data, int64_t count, CommType type, int root) {
  checked_collective_bytes("broadcast", data, data, count, type, 1);
  ZD_CHECK(root >= 0 && root < size_, "broadcast: root {} outside a world of {} ranks", root,
           size_);
  const size_t bytes = static_cast<size_t>(count) * comm_type_size(type);
  return executor_->submit("broadcast",
                           fmt::format("{} x {}, root {}", count, comm_type_name(type), root),
                           static_cast<int64_t>(bytes), [this, data, bytes, root](Link& link) {
                             gloo_backend::tree_broadcast(link, data, bytes, root, tuning_);
                           });
}

WorkPtr GlooCommunicator::barrier_async() {
  return executor_->submit("barrier", fmt::format("{} ranks", size_), 0,
                           [](Link& link) { gloo_backend::barrier(link); });
}

WorkPtr GlooCommunicator::all_to_all_async(const void* send, void* recv, int64_t count,
                                           CommType type) {
  const size_t bytes = checked_collective_bytes("all_to_all", send, recv, count, type, size_);
  check_disjoint("all_to_all", send, bytes * size_, recv, bytes * size_);
  return executor_->submit("all_to_all",
                           fmt::format("{} x {} per rank", count, comm_type_name(type)),
                           static_cast<int64_t>(bytes) * size_, [send, recv, bytes](Link& link) {
                             gloo_backend::direct_all_to_all(link, send, recv, bytes);
                           });
}

std::string GlooCommunicator::peer_name(int peer) const {
  return peer == kNoPeer ? std::string("nobody") : fmt::format("rank {}", names_.global(peer));
}

WorkPtr GlooCommunicator::send_recv_async(const void* send, int dst, void* recv, int src,
                                          int64_t count, CommType type) {
  const size_t bytes = checked_send_recv_bytes(send, dst, recv, src, count, type, rank_, size_);
  // The detail (hashed into the message slots) is the same on every rank; the peers are not.
  return executor_->submit(
      "send_recv", fmt::format("{} x {}", count, comm_type_name(type)), static_cast<int64_t>(bytes),
      [send, dst, recv, src, bytes](Link& link) {
        gloo_backend::send_recv(link, send, dst, recv, src, bytes);
      },
      fmt::format("to {}, from {}", peer_name(dst), peer_name(src)));
}

}  // namespace

const char* gloo_algorithm_name(GlooAlgorithm a) {
  switch (a) {
    case GlooAlgorithm::kAuto:
      return "auto";
    case GlooAlgorithm::kRing:
      return "ring";
    case GlooAlgorithm::kDirect:
      return "direct";
    case GlooAlgorithm::kGloo:
      return "gloo";
    case GlooAlgorithm::kShared:
      return "shared";
  }
  ZD_THROW("unknown GlooAlgorithm {}", static_cast<int>(a));
}

GlooAlgorithm parse_gloo_algorithm(const std::string& name) {
  for (auto a : {GlooAlgorithm::kAuto, GlooAlgorithm::kRing, GlooAlgorithm::kDirect,
                 GlooAlgorithm::kGloo, GlooAlgorithm::kShared}) {
    if (name == gloo_algorithm_name(a)) return a;
  }
  ZD_THROW_INPUT("unknown Gloo algorithm '{}': expected auto, ring, direct, gloo or shared", name);
}

std::unique_ptr<Communicator> make_gloo_communicator(const GlooOptions& options) {
  return std::make_unique<GlooCommunicator>(options);
}

}  // namespace zerod
