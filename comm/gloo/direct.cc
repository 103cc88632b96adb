// One-round collectives on Gloo's unbound buffers (see algorithms.h): every rank sends to every
// other rank at once, then reduces what it received in rank order.
#include <cstring>
#include <vector>

#include <gloo/transport/unbound_buffer.h>

#include "comm/gloo/algorithms.h"
#include "comm/gloo/exchange.h"
#include "comm/gloo/reduce.h"

namespace zerod::gloo_backend {

void direct_all_reduce(Link& link, Scratch& scratch, void* data, size_t count, CommType type,
                       ReduceOp op) {
  const int n = link.size();
  const int r = link.rank();
  if (n == 1 || count == 0) return;
  const size_t bytes = count * comm_type_size(type);
  auto* d = static_cast<uint8_t*>(data);
  uint8_t* tmp = scratch.get(n * bytes);  // slot p: rank p's vector; slot r: partial results
  exchange_with_all(
      link, kDirectChannel, bytes, [&](int p) { return tmp + p * bytes; }, [&](int) { return d; });
  auto x = [&](int q) -> const uint8_t* { return q == r ? d : tmp + q * bytes; };
  fold_in_rank_order(n, x, tmp + r * bytes, d, count, type, op);
}

void direct_reduce_scatter(Link& link, Scratch& scratch, const void* send, void* recv, size_t count,
                           CommType type, ReduceOp op) {
  const int n = link.size();
  const int r = link.rank();
  const size_t bytes = count * comm_type_size(type);
  const auto* s = static_cast<const uint8_t*>(send);
  auto* o = static_cast<uint8_t*>(recv);
  if (count == 0) return;
  if (n == 1) {
    if (s != o) std::memcpy(o, s, bytes);
    return;
  }
  uint8_t* tmp = scratch.get(n * bytes);  // slot p: rank p's part of chunk r; slot r: partials
  exchange_with_all(
      link, kDirectChannel, bytes, [&](int p) { return tmp + p * bytes; },
      [&](int p) { return s + p * bytes; });
  auto x = [&](int q) -> const uint8_t* { return q == r ? s + r * bytes : tmp + q * bytes; };
  fold_in_rank_order(n, x, tmp + r * bytes, o, count, type, op);
}

void direct_all_gather(Link& link, const void* send, void* recv, size_t bytes) {
  const int n = link.size();
  const int r = link.rank();
  auto* o = static_cast<uint8_t*>(recv);
  if (bytes == 0) return;
  if (send != o + r * bytes) std::memcpy(o + r * bytes, send, bytes);
  if (n == 1) return;
  exchange_with_all(
      link, kDirectChannel, bytes, [&](int p) { return o + p * bytes; },
      [&](int) { return o + r * bytes; });
}

}  // namespace zerod::gloo_backend
