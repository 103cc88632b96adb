// Collectives between ranks that are threads of one process (see algorithms.h and
// shared_group.h): the ranks exchange their buffers' addresses in one round of tiny messages over
// the Link, read each other's buffers directly, and meet in a barrier of tiny messages before any
// of them returns. The Link carries every wait, so timeouts, aborts, dead peers and their errors
// are the TCP algorithms'; the data never crosses a socket.
//
// Each chunk is reduced once, by its owner, and then copied: every rank ends with the same bits.
// The chunks and the order of each fold are the ring's (ring.cc: chunk c is folded from rank c+1
// around to rank c), so ranks in one process get the bits that ranks in separate processes get
// over TCP.
#include <algorithm>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "comm/gloo/algorithms.h"
#include "comm/gloo/exchange.h"
#include "comm/gloo/reduce.h"
#include "comm/gloo/shared_group.h"

namespace zerod::gloo_backend {

namespace {

// The addresses every rank contributes (k per rank), exchanged: all[p * k + j] is rank p's j-th.
std::vector<uintptr_t> exchange_addresses(Link& link, std::vector<uintptr_t> mine) {
  const size_t k = mine.size();
  std::vector<uintptr_t> all(static_cast<size_t>(link.size()) * k);
  std::copy(mine.begin(), mine.end(), all.begin() + static_cast<ptrdiff_t>(link.rank() * k));
  exchange_with_all(
      link, kSharedChannel, k * sizeof(uintptr_t), [&](int p) { return &all[p * k]; },
      [&](int) { return mine.data(); });
  return all;
}

// Every rank has reached this point (a round of empty messages between every pair).
void meet(Link& link) {
  static uint8_t nothing = 0;
  exchange_with_all(
      link, kSharedBarrierChannel, 0, [&](int) { return &nothing; }, [&](int) { return &nothing; });
}

// Reads of rank `owner`'s buffers in collective `seq`; throws PeerError when it has left.
class Reading {
 public:
  Reading(SharedGroup& group, const Link& link, int owner) : group_(group), owner_(owner) {
    if (!group_.begin_read(owner, link.seq())) {
      throw PeerError(owner, false,
                      fmt::format("rank {} left collective #{} while its buffers were to be read",
                                  owner, link.seq()));
    }
  }
  ~Reading() { group_.end_read(owner_); }
  Reading(const Reading&) = delete;
  Reading& operator=(const Reading&) = delete;

 private:
  SharedGroup& group_;
  int owner_;
};

// Marks this rank as reading every peer (the fold reads them all).
struct ReadingAll {
  ReadingAll(SharedGroup& group, const Link& link) {
    for (int q = 0; q < link.size(); ++q)
      if (q != link.rank()) readers.push_back(std::make_unique<Reading>(group, link, q));
  }
  std::vector<std::unique_ptr<Reading>> readers;
};

// Chunk q of `count` elements split in n as the ring splits them (the first count % n chunks one
// element longer): [chunk_begin(q), chunk_begin(q + 1)).
size_t chunk_begin(size_t count, int n, int q) {
  const size_t un = static_cast<size_t>(n), uq = static_cast<size_t>(q);
  return uq * (count / un) + std::min(uq, count % un);
}

// out (len) = the fold of chunk c's pieces in the ring's order: x(c+1) op x(c+2) op ... op x(c),
// where at(q) is rank q's piece; out may alias at(c).
template <class At>
void fold_as_the_ring(int n, int c, At at, uint8_t* acc, uint8_t* out, size_t len, CommType type,
                      ReduceOp op) {
  fold_in_rank_order(
      n, [&](int j) -> const uint8_t* { return at((c + 1 + j) % n); }, acc, out, len, type, op);
}

}  // namespace

void shared_all_reduce(Link& link, SharedGroup& group, Scratch& scratch, void* data, size_t count,
                       CommType type, ReduceOp op) {
  const int n = link.size();
  const int r = link.rank();
  if (n == 1 || count == 0) return;
  const size_t elem = comm_type_size(type);
  SharedScope scope(group, r, link.seq());
  const std::vector<uintptr_t> at = exchange_addresses(link, {reinterpret_cast<uintptr_t>(data)});
  auto base = [&](int q) { return reinterpret_cast<uint8_t*>(at[static_cast<size_t>(q)]); };
  // 1. This rank's chunk, reduced over every rank's vector into its own (no peer reads this
  //    chunk of this rank's vector: each reduces its own chunk).
  const size_t lo = chunk_begin(count, n, r), hi = chunk_begin(count, n, r + 1);
  if (hi > lo) {
    ReadingAll reading(group, link);
    uint8_t* acc = n > 2 ? scratch.get((hi - lo) * elem) : nullptr;
    fold_as_the_ring(
        n, r, [&](int q) -> const uint8_t* { return base(q) + lo * elem; }, acc,
        base(r) + lo * elem, hi - lo, type, op);
  }
  meet(link);  // every chunk is final
  // 2. The other chunks, copied from their owners (each owner's chunk is read, never written,
  //    by the others now).
  for (int q = 0; q < n; ++q) {
    if (q == r) continue;
    const size_t qlo = chunk_begin(count, n, q), qhi = chunk_begin(count, n, q + 1);
    if (qhi == qlo) continue;
    Reading reading(group, link, q);
    std::memcpy(base(r) + qlo * elem, base(q) + qlo * elem, (qhi - qlo) * elem);
  }
  meet(link);  // nobody reads this rank's vector any more
}

void shared_reduce_scatter(Link& link, SharedGroup& group, Scratch& scratch, const void* send,
                           void* recv, size_t count, CommType type, ReduceOp op) {
  const int n = link.size();
  const int r = link.rank();
  const size_t bytes = count * comm_type_size(type);
  if (count == 0) return;
  if (n == 1) {
    if (send != recv) std::memcpy(recv, send, bytes);
    return;
  }
  SharedScope scope(group, r, link.seq());
  const std::vector<uintptr_t> at = exchange_addresses(link, {reinterpret_cast<uintptr_t>(send)});
  {
    ReadingAll reading(group, link);
    uint8_t* acc = n > 2 ? scratch.get(bytes) : nullptr;
    // Peers read block q != r of this rank's input; block r (which recv may alias) is this
    // rank's alone.
    fold_as_the_ring(
        n, r,
        [&](int q) -> const uint8_t* {
          return reinterpret_cast<const uint8_t*>(at[static_cast<size_t>(q)]) + r * bytes;
        },
        acc, static_cast<uint8_t*>(recv), count, type, op);
  }
  meet(link);
}

void shared_all_gather(Link& link, SharedGroup& group, const void* send, void* recv, size_t bytes) {
  const int n = link.size();
  const int r = link.rank();
  auto* o = static_cast<uint8_t*>(recv);
  if (bytes == 0) return;
  if (send != o + r * bytes) std::memcpy(o + r * bytes, send, bytes);
  if (n == 1) return;
  SharedScope scope(group, r, link.seq());
  // Each rank's block, wherever its input is (its block of its own output, in place).
  const std::vector<uintptr_t> at =
      exchange_addresses(link, {reinterpret_cast<uintptr_t>(o + r * bytes)});
  for (int q = 0; q < n; ++q) {
    if (q == r) continue;
    Reading reading(group, link, q);
    std::memcpy(o + q * bytes, reinterpret_cast<const uint8_t*>(at[static_cast<size_t>(q)]), bytes);
  }
  meet(link);
}

}  // namespace zerod::gloo_backend
