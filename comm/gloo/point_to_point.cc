// All-to-all and send/receive pairs on Gloo's unbound buffers (see algorithms.h): every transfer
// of the operation is posted at once, then waited for, receives first.
#include <gloo/transport/unbound_buffer.h>

#include <cstring>
#include <vector>

#include "comm/gloo/algorithms.h"

namespace zerod::gloo_backend {

void direct_all_to_all(Link& link, const void* send, void* recv, size_t bytes) {
  const int n = link.size();
  const int r = link.rank();
  if (bytes == 0) return;
  const auto* s = static_cast<const uint8_t*>(send);
  auto* o = static_cast<uint8_t*>(recv);
  // Peers in the order r+1, r+2, ... so that the ranks do not all send to rank 0 first.
  std::vector<Buffer> in(n), out(n);
  for (int k = 1; k < n; ++k) {
    const int p = (r - k + n) % n;  // receive order: the ranks that send to us k-th
    in[p] = link.buffer(o + p * bytes, bytes);
    link.recv(in[p], p, 0, bytes, kAllToAllChannel);
  }
  for (int k = 1; k < n; ++k) {
    const int p = (r + k) % n;
    out[p] = link.buffer(s + p * bytes, bytes);
    link.send(out[p], p, 0, bytes, kAllToAllChannel);
  }
  std::memcpy(o + r * bytes, s + r * bytes, bytes);  // our own block, while the others move
  for (int k = 1; k < n; ++k) {
    const int p = (r - k + n) % n;
    link.wait_recv(in[p], p);
  }
  for (int k = 1; k < n; ++k) {
    const int p = (r + k) % n;
    link.wait_send(out[p], p);  // before the caller may reuse the sent memory
  }
}

void send_recv(Link& link, const void* send, int dst, void* recv, int src, size_t bytes) {
  if (bytes == 0) return;
  if (dst == link.rank()) {  // then src is this rank too
    std::memcpy(recv, send, bytes);
    return;
  }
  Buffer in = nullptr, out = nullptr;
  if (src != kNoPeer) {
    in = link.buffer(recv, bytes);
    link.recv(in, src, 0, bytes, kSendRecvChannel);
  }
  if (dst != kNoPeer) {
    out = link.buffer(send, bytes);
    link.send(out, dst, 0, bytes, kSendRecvChannel);
  }
  if (in != nullptr) link.wait_recv(in, src);
  if (out != nullptr) link.wait_send(out, dst);
}

}  // namespace zerod::gloo_backend
