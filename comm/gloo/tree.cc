// Broadcast down a binomial tree and a dissemination barrier, on Gloo's unbound buffers (see
// algorithms.h).
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <vector>

#include "comm/gloo/algorithms.h"

namespace zerod::gloo_backend {

void tree_broadcast(Link& link, void* data, size_t bytes, int root, const Tuning& tuning) {
  const int n = link.size();
  if (n == 1 || bytes == 0) return;
  // Virtual ranks put the root at 0. The parent of v clears v's lowest set bit; the children of
  // v are v + 2^k for every 2^k below v's lowest set bit (every 2^k < n for the root).
  const int v = (link.rank() - root + n) % n;
  const int low = v == 0 ? n : (v & -v);
  auto real = [&](int vr) { return (vr + root) % n; };
  std::vector<int> children;
  for (int step = 1; step < low && v + step < n; step <<= 1) children.push_back(real(v + step));
  const int parent = v == 0 ? -1 : real(v - low);

  const size_t seg = tuning.segment_elems(bytes, 1);
  const size_t nseg = (bytes + seg - 1) / seg;
  Buffer in = link.buffer(data, bytes);
  std::vector<Buffer> out;  // one view per child, so that a failed send names its child
  for (size_t c = 0; c < children.size(); ++c) out.push_back(link.buffer(data, bytes));
  if (parent >= 0) {
    for (size_t j = 0; j < nseg; ++j) {
      link.recv(in, parent, j * seg, std::min(seg, bytes - j * seg), kBroadcastChannel);
    }
  }
  for (size_t j = 0; j < nseg; ++j) {
    if (parent >= 0) link.wait_recv(in, parent);  // segment j has arrived: pass it on
    for (size_t c = 0; c < children.size(); ++c) {
      link.send(out[c], children[c], j * seg, std::min(seg, bytes - j * seg), kBroadcastChannel);
    }
  }
  for (size_t c = 0; c < children.size(); ++c) {
    for (size_t j = 0; j < nseg; ++j) link.wait_send(out[c], children[c]);
  }
}

void barrier(Link& link) {
  const int n = link.size();
  const int r = link.rank();
  Buffer empty = link.buffer(nullptr, 0);
  int round = 0;
  for (int d = 1; d < n; d <<= 1, ++round) {
    const int from = (r - d + n) % n;
    const int to = (r + d) % n;
    link.recv(empty, from, 0, 0, kBarrierChannel + round);
    link.send(empty, to, 0, 0, kBarrierChannel + round);
    link.wait_recv(empty, from);
    link.wait_send(empty, to);
  }
}

}  // namespace zerod::gloo_backend
