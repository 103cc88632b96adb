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
};

}  // namespace zerod
