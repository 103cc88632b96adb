// Collectives between the ranks of a job (DESIGN.md section 4): one interface, one backend per
// folder (comm/gloo/ for CPU ranks over TCP; comm/nccl/ for GPUs later).
//
// Every collective exists in two forms: `*_async` returns a Work handle at once (the backend
// runs collectives in issue order on its own communication thread/stream, so they overlap
// compute), and the plain form waits for it. Buffers must stay valid until the Work is done.
// Each collective gets the next sequence number of this communicator; all ranks must issue the
// same collectives in the same order.
//
// Errors (thrown by Work::wait or the plain form) are zerod::Error with kind kPeerLost (exit
// code 3) and name the operation, its sequence number, its size, and the ranks that had not
// arrived (from the PeerMonitor): a collective that does not finish within the timeout, or a
// peer whose connection broke. After such an error the communicator is broken: every later
// call throws at once. Bad arguments (negative count, null buffer, root or peer out of range,
// overlapping buffers where they must not overlap) throw Error(kInternal) from the call itself
// and take no sequence number.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace zerod {

class CollectiveLog;

// kBF16 / kF16: 16-bit floats, the compute dtype of GPU tensors. The NCCL backend reduces them
// natively; the Gloo backend moves them (gather, broadcast) but does not reduce them (CPU ranks
// keep every compute tensor in fp32).
enum class CommType : uint8_t { kF32, kF64, kI32, kI64, kU8, kBF16, kF16 };
enum class ReduceOp : uint8_t { kSum, kMax };

// send_recv's "no peer": nothing is sent (dst) or received (src) in this call.
constexpr int kNoPeer = -1;

size_t comm_type_size(CommType t);
const char* comm_type_name(CommType t);
const char* reduce_op_name(ReduceOp op);
// The argument checks of a collective over `ranks` blocks of `count` elements (Error kInternal:
// negative count, null buffer, a byte size that overflows); returns the bytes of one block.
size_t checked_collective_bytes(const char* op, const void* a, const void* b, int64_t count,
                                CommType type, int64_t ranks);
// Error kInternal when [a, a + a_bytes) and [b, b + b_bytes) share a byte (`op` names the call).
void check_disjoint(const char* op, const void* a, size_t a_bytes, const void* b, size_t b_bytes);
// The argument checks of send_recv on `rank` of a world of `size` ranks (Error kInternal: a
// peer that is neither a rank nor kNoPeer, a send to itself without the receive from itself or
// the other way round, a negative count, a null buffer on a side that moves data, overlapping
// buffers); returns the bytes of `count` elements.
size_t checked_send_recv_bytes(const void* send, int dst, const void* recv, int src, int64_t count,
                               CommType type, int rank, int size);

// Point to point (send_async / recv_async / p2p_async below): one message between two ranks of a
// communicator. A kSend of `count` elements of `type` at `data` to `peer`, or a kRecv of them
// from `peer` into `data`; `tag` (>= 0) is a label checked on arrival (see Communicator).
struct P2POp {
  enum class Kind : uint8_t { kSend, kRecv };
  Kind kind = Kind::kSend;
  void* data = nullptr;  // (const for a send)
  int64_t count = 0;
  CommType type = CommType::kF32;
  int peer = 0;
  int tag = 0;
};
const char* p2p_kind_name(P2POp::Kind k);  // "send", "recv"
// The argument checks of one message on `rank` of a communicator of `size` ranks (Error
// kInternal: a peer outside the communicator or the rank itself, a negative tag or count, a null
// buffer, a byte size that overflows); returns its bytes.
size_t checked_p2p_bytes(const P2POp& op, int rank, int size);

class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the collective is done; rethrows its error.
  virtual void wait() = 0;
  // True once the collective finished (successfully or not); never blocks.
  virtual bool done() const = 0;
  virtual int64_t sequence() const = 0;
};
using WorkPtr = std::shared_ptr<Work>;

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* backend() const = 0;
  // Collectives issued so far (the sequence number of the last one).
  virtual int64_t sequence() const = 0;
  virtual std::chrono::milliseconds timeout() const = 0;
  // What this communicator did: totals per operation and its recent collectives (null: a
  // backend that keeps none, e.g. the world of one).
  virtual const CollectiveLog* collective_log() const { return nullptr; }

  // data (count) = op over ranks of data (count); in place.
  virtual WorkPtr all_reduce_async(void* data, int64_t count, CommType type, ReduceOp op) = 0;
  // recv (count) = op over ranks of send[rank*count, (rank+1)*count); send has size*count
  // elements. recv may alias send + rank*count (in place).
  virtual WorkPtr reduce_scatter_async(const void* send, void* recv, int64_t count, CommType type,
                                       ReduceOp op) = 0;
  // recv (size*count): recv[r*count, (r+1)*count) = send (count) of rank r. send may alias
  // recv + rank*count (in place).
  virtual WorkPtr all_gather_async(const void* send, void* recv, int64_t count, CommType type) = 0;
  // data (count) of root copied to every rank.
  virtual WorkPtr broadcast_async(void* data, int64_t count, CommType type, int root) = 0;
  virtual WorkPtr barrier_async() = 0;
  // send (size*count): block r, send[r*count, (r+1)*count), goes to rank r; recv (size*count):
  // block r, recv[r*count, (r+1)*count), comes from rank r (the block `rank` of its send). The
  // transposition of blocks between ranks (Ulysses' sequence <-> head exchange, MoE dispatch).
  // send and recv must not overlap.
  virtual WorkPtr all_to_all_async(const void* send, void* recv, int64_t count, CommType type) = 0;
  // Point to point, one step of a ring or a pipeline: send (count) goes to rank `dst` while recv
  // (count) is received from rank `src`, in one operation (both directions at once, so a ring of
  // send_recv cannot deadlock). Like a collective, every rank of the communicator issues it, in
  // the same order, with the same count and type (it takes a sequence number); the pairs must
  // match: rank r sends to d exactly when rank d receives from r in that call (a ring: dst =
  // rank + 1, src = rank - 1, mod size). dst or src may be kNoPeer (nothing sent / received;
  // that side's buffer may then be null) and may be the rank itself (a copy). send and recv must
  // not overlap (a ring passes blocks between two buffers).
  virtual WorkPtr send_recv_async(const void* send, int dst, void* recv, int src, int64_t count,
                                  CommType type) = 0;

  // ---- Point to point (issue 22: pipeline neighbours; DESIGN.md section 8) ------------------
  // One message between two ranks of this communicator, issued by those two ranks only, at
  // whatever moment each reaches it: send_async posts `count` elements of `type` at `data` to
  // rank `dst`, recv_async posts a receive of them from rank `src` into `data`. Ranks are this
  // communicator's (on a sub-group from ProcessGroups, e.g. the pipeline group, the ranks local to
  // that group). They take no sequence number (their Work::sequence() is their negative id in the
  // collective log): the collectives of the ranks that exchange messages stay numbered alike with
  // those of the ranks that do not.
  //
  // Matching: the k-th send from a to b matches the k-th receive on b from a, per ordered pair of
  // ranks (the two directions are independent), whatever the tags; several messages may be in
  // flight in each direction, and sends and receives never wait for each other's issue order
  // (a rank may post its receive of a gradient before its send of an activation, its peer the
  // other way round). The tag is a label, not a matching key: the receive fails when the matched
  // message's tag or size differs from its own (a schedule out of step, caught where it starts).
  // Order-matching is what NCCL offers (ncclSend / ncclRecv have no tags), so code written
  // against one backend runs on the other; a pipeline schedule is data whose send/receive order
  // is verified before it runs (parallel/pipeline/).
  //
  // Completion: Work::wait() returns once the message is delivered (receive) or taken by the
  // transport so that `data` may be reused (send); the buffer must stay valid and unmodified until
  // then. A send may complete only once the peer has posted the matching receive (Gloo's
  // rendezvous, NCCL's send), so a rank posts (or batches) the receives its peer waits for before
  // it waits for its own sends. A message not done `timeout()` after it was issued fails with
  // Error(kPeerLost) naming the direction, the peer rank, the tag and the bytes; a peer that died
  // (its connection closed, or the PeerMonitor says it is dead) fails it promptly. A size or tag
  // mismatch is Error(kInternal) on the receiving rank. Any failure breaks the communicator as a
  // failed collective does (its peers then fail promptly too, never hang). Sends to the rank itself
  // are an error (Error kInternal at the call): a pipeline stage never sends to itself, and a world
  // of one has no peer. The collective log records each message under "send" or "recv" with its
  // bytes.
  //
  // Why on the Communicator and not a separate neighbour-link object: a message needs exactly
  // what a collective needs (the group's connections, rank names, timeout, peer monitor,
  // breaking on failure, the collective log), and every group from ProcessGroups already is a
  // Communicator with local ranks; a pipeline stage holds its group's communicator and its two
  // neighbours' ranks, which is all a "link" would add.
  virtual WorkPtr send_async(const void* data, int64_t count, CommType type, int dst, int tag) = 0;
  virtual WorkPtr recv_async(void* data, int64_t count, CommType type, int src, int tag) = 0;
  // Several messages issued together, one Work for all (wait() waits for every one and throws the
  // first failure). NCCL fuses them into one group (ncclGroupStart / ncclGroupEnd), which is how
  // a rank that sends to and receives from the same peer at one step must issue them there
  // (Megatron's batch_isend_irecv): NCCL runs point-to-point calls in issue order on one stream.
  // The default issues each message in turn (Gloo posts every message at once anyway).
  virtual WorkPtr p2p_async(const std::vector<P2POp>& ops);

  void all_reduce(void* data, int64_t count, CommType type, ReduceOp op) {
    all_reduce_async(data, count, type, op)->wait();
  }
  void reduce_scatter(const void* send, void* recv, int64_t count, CommType type, ReduceOp op) {
    reduce_scatter_async(send, recv, count, type, op)->wait();
  }
  void all_gather(const void* send, void* recv, int64_t count, CommType type) {
    all_gather_async(send, recv, count, type)->wait();
  }
  void broadcast(void* data, int64_t count, CommType type, int root) {
    broadcast_async(data, count, type, root)->wait();
  }
  void barrier() { barrier_async()->wait(); }
  void all_to_all(const void* send, void* recv, int64_t count, CommType type) {
    all_to_all_async(send, recv, count, type)->wait();
  }
  void send_recv(const void* send, int dst, void* recv, int src, int64_t count, CommType type) {
    send_recv_async(send, dst, recv, src, count, type)->wait();
  }
  void send(const void* data, int64_t count, CommType type, int dst, int tag) {
    send_async(data, count, type, dst, tag)->wait();
  }
  void recv(void* data, int64_t count, CommType type, int src, int tag) {
    recv_async(data, count, type, src, tag)->wait();
  }
};

}  // namespace zerod
