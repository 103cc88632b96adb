// The collective algorithms of the Gloo backend (comm/gloo/), on one Link (one collective).
//
//  ring_*    pipelined rings on Gloo's point-to-point unbound buffers (ring.cc): the vector is
//            cut into one chunk per rank and each chunk into segments; a reduce-scatter passes
//            partial sums of each chunk once around the ring, an all-gather passes the final
//            chunks around; several segment receives are in flight so the sockets never idle
//            while a segment is reduced. All-reduce = reduce-scatter then all-gather, where a
//            segment is gathered as soon as it is final. Each chunk is reduced in one place and
//            then copied, so every rank ends with identical bits.
//  direct_*  one round (direct.cc): every rank sends to every other rank at once and reduces
//            what it receives in rank order (identical bits on every rank). Least latency; for
//            all-reduce it moves n/2 times the bytes of the ring (the same with 2 ranks), and it
//            keeps n copies in scratch memory, so it serves small sizes (and 2 ranks) only.
//  tree_broadcast, barrier (tree.cc): a binomial tree rooted at `root`, segments forwarded
//            as they arrive; a dissemination barrier (log2(n) rounds of empty messages).
//  direct_all_to_all, send_recv (point_to_point.cc): one round in which every rank sends each
//            peer its block and receives each peer's block (the bytes any all-to-all must move,
//            no scratch memory); one send and one receive posted together.
//  shared_*  ranks that are threads of one process (shared.cc, shared_group.h): each rank reads
//            its peers' buffers directly once their addresses are exchanged (a round of tiny
//            messages on the Link), and a barrier of tiny messages ends the collective; all-reduce
//            = each rank reduces its chunk in place, a barrier, each copies the others' chunks.
//            Memory bandwidth instead of loopback TCP; the ring's chunks and order of reduction,
//            so the ring's bits.
//  gloo_*    Gloo's own all-reduce and all-gather through its options API (native.cc), kept
//            for comparison (GlooAlgorithm::kGloo). Their waits cannot be aborted from another
//            thread; they time out on Gloo's own clock.
//
// Why not Gloo's algorithm classes (AllreduceRing, AllreduceHalvingDoubling, AllgatherRing,
// ReduceScatterHalvingDoubling, ...): they use Gloo's bound buffers, whose send path calls
// setsockopt(SO_SNDBUF, message size) on the socket. A small collective (a 4-byte flag) thus
// pins the send buffer near the kernel's minimum and turns off TCP's buffer autotuning for the
// life of the connection; every later transfer through unbound buffers (all of Gloo's options
// API) then stalls on delayed ACKs: in a probe, a 64 KB exchange took 0.1 ms on a fresh
// connection and 4-48 ms after one 4-byte AllreduceRing. That is most likely what made the
// options API look ~3x slower than the classes in a quick probe. Measured on fresh connections
// (gloo_communicator.cc), the classes are no faster than the options API for all-reduce, and
// our reduce-scatter beats both; so every transfer here stays on unbound buffers, which keeps
// autotuning on. (The classes also need one object per buffer pointer and size, with slots
// fixed at construction.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "comm/communicator.h"
#include "comm/gloo/link.h"

namespace gloo {
class Context;
}

namespace zerod::gloo_backend {

struct Tuning {
  size_t segment_bytes = 0;  // pipeline segment; 0: a quarter of a chunk, within the bounds below
  size_t min_segment_bytes = 512 << 10;
  size_t max_segment_bytes = 4 << 20;
  size_t window = 0;  // ring receives in flight; 0: as many as fit in staging_bytes / 2
  size_t staging_bytes = 32 << 20;  // reduce-scatter staging slots, at most

  // Segment (elements of `elem` bytes) for chunks of up to `chunk_elems` elements.
  size_t segment_elems(size_t chunk_elems, size_t elem) const;
  // Receives in flight for segments of `segment_bytes`.
  size_t window_for(size_t segment_bytes) const;
};

// Channels (Link) of the collectives; distinct within one collective.
constexpr int kPartialChannel = 0;    // ring reduce-scatter: partial sums passed on
constexpr int kFinalChannel = 1;      // ring reduce-scatter: contributions to the receiver's chunk
constexpr int kAllGatherChannel = 2;  // ring all-gather (and all-reduce's gather phase)
constexpr int kDirectChannel = 3;
constexpr int kBroadcastChannel = 4;
constexpr int kAllToAllChannel = 5;
constexpr int kSendRecvChannel = 6;
constexpr int kBarrierChannel = 8;  // + round (at most 32 rounds)
constexpr int kSharedChannel = 40;  // shared-memory collectives: the buffers' addresses
constexpr int kSharedBarrierChannel = 41;

// Memory reused across the collectives of one communicator (its communication thread only).
class Scratch {
 public:
  uint8_t* get(size_t bytes);

 private:
  std::unique_ptr<uint8_t[]> data_;
  size_t size_ = 0;
};

// data (count) = op over ranks of data (count); in place.
void ring_all_reduce(Link& link, Scratch& scratch, void* data, size_t count, CommType type,
                     ReduceOp op, const Tuning& tuning);
// recv (count) = op over ranks of send[rank*count, (rank+1)*count); recv may alias that slice.
void ring_reduce_scatter(Link& link, Scratch& scratch, const void* send, void* recv, size_t count,
                         CommType type, ReduceOp op, const Tuning& tuning);
// recv (size*bytes): slice r = send (bytes) of rank r; send may alias recv + rank*bytes.
void ring_all_gather(Link& link, const void* send, void* recv, size_t bytes, const Tuning& tuning);

void direct_all_reduce(Link& link, Scratch& scratch, void* data, size_t count, CommType type,
                       ReduceOp op);
void direct_reduce_scatter(Link& link, Scratch& scratch, const void* send, void* recv, size_t count,
                           CommType type, ReduceOp op);
void direct_all_gather(Link& link, const void* send, void* recv, size_t bytes);

class SharedGroup;
// The same three over shared memory (every rank of the Link a thread of this process, `group`
// their SharedGroup).
void shared_all_reduce(Link& link, SharedGroup& group, Scratch& scratch, void* data, size_t count,
                       CommType type, ReduceOp op);
void shared_reduce_scatter(Link& link, SharedGroup& group, Scratch& scratch, const void* send,
                           void* recv, size_t count, CommType type, ReduceOp op);
void shared_all_gather(Link& link, SharedGroup& group, const void* send, void* recv, size_t bytes);

// data (bytes) of `root` copied to every rank.
void tree_broadcast(Link& link, void* data, size_t bytes, int root, const Tuning& tuning);
void barrier(Link& link);

// send (size*bytes): block r goes to rank r; recv (size*bytes): block r comes from rank r. The
// buffers do not overlap.
void direct_all_to_all(Link& link, const void* send, void* recv, size_t bytes);
// send (bytes) to rank dst while recv (bytes) comes from rank src; either may be kNoPeer
// (communicator.h), and both are the rank itself or neither is (then a copy). No overlap.
void send_recv(Link& link, const void* send, int dst, void* recv, int src, size_t bytes);

// Gloo's collectives; `tag` keeps collectives apart (the low 32 bits of the sequence number).
void gloo_all_reduce(const std::shared_ptr<gloo::Context>& context, void* data, size_t count,
                     CommType type, ReduceOp op, uint32_t tag, std::chrono::milliseconds timeout);
void gloo_all_gather(const std::shared_ptr<gloo::Context>& context, const void* send, void* recv,
                     size_t bytes, uint32_t tag, std::chrono::milliseconds timeout);

}  // namespace zerod::gloo_backend
