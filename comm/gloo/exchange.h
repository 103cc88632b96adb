// One round of messages between every pair of ranks of a collective (comm/gloo/): the direct
// algorithms' data exchange, and the shared-memory algorithms' address exchange and barriers.
#pragma once

#include <cstddef>
#include <vector>

#include <gloo/transport/unbound_buffer.h>

#include "comm/gloo/link.h"

namespace zerod::gloo_backend {

// One round with every peer at once on `channel`: receive `bytes` from each rank p into in_at(p)
// while sending out_at(p) to it; returns when every transfer is done.
template <class In, class Out>
void exchange_with_all(Link& link, int channel, size_t bytes, In in_at, Out out_at) {
  const int n = link.size();
  const int r = link.rank();
  std::vector<Buffer> in(n), out(n);
  for (int p = 0; p < n; ++p) {
    if (p == r) continue;
    in[p] = link.buffer(in_at(p), bytes);
    link.recv(in[p], p, 0, bytes, channel);
  }
  for (int p = 0; p < n; ++p) {
    if (p == r) continue;
    out[p] = link.buffer(out_at(p), bytes);
    link.send(out[p], p, 0, bytes, channel);
  }
  for (int p = 0; p < n; ++p) {
    if (p != r) link.wait_recv(in[p], p);
  }
  for (int p = 0; p < n; ++p) {
    if (p != r) link.wait_send(out[p], p);  // before the sent memory may be overwritten
  }
}

}  // namespace zerod::gloo_backend
