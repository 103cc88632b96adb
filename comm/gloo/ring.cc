// Pipelined rings on Gloo's unbound buffers (see algorithms.h).
#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

#include <gloo/transport/unbound_buffer.h>

#include "comm/gloo/algorithms.h"
#include "comm/gloo/reduce.h"
#include "core/error.h"

namespace zerod::gloo_backend {

namespace {

int mod(int a, int n) {
  return ((a % n) + n) % n;
}

// `total` elements cut into n chunks as equal as possible (the first total % n get one more).
struct Chunks {
  size_t total;
  size_t n;
  size_t begin(int c) const { return c * (total / n) + std::min<size_t>(c, total % n); }
  size_t len(int c) const { return total / n + (static_cast<size_t>(c) < total % n ? 1 : 0); }
};

// Elements [begin, begin+len) of the whole vector, inside chunk `chunk`.
struct Segment {
  int chunk;
  size_t begin;
  size_t len;
};

// The segments of chunk c, `seg` elements each (the last one shorter).
template <class F>
void for_segments(const Chunks& ch, int c, size_t seg, F&& f) {
  const size_t b = ch.begin(c);
  const size_t l = ch.len(c);
  for (size_t o = 0; o < l; o += seg) f(Segment{c, b + o, std::min(seg, l - o)});
}

// Segment j (`seg` elements) of chunk c; empty past the chunk's end.
Segment slice(const Chunks& ch, int c, size_t j, size_t seg) {
  const size_t len = ch.len(c);
  const size_t off = std::min(len, j * seg);
  return Segment{c, ch.begin(c) + off, std::min(seg, len - off)};
}

// Ring reduce-scatter over the chunks `ch` (one per rank) of this rank's vector `local`:
// afterwards `out` (chunk `rank`'s length) holds chunk `rank` reduced over all ranks; out may
// alias local + begin(rank). `on_final` runs after each segment of chunk `rank` is final.
//
// Step s (0..n-2) sends chunk r-s-1 to the right and receives chunk r-s-2 from the left: at
// step 0 the chunk sent is this rank's own contribution, later it is the partial sum received at
// the previous step plus this rank's contribution; the last step receives chunk r. Chunks are
// cut into segments, and the ring runs segment by segment (all steps of segment j, then segment
// j+1), so a partial sum goes on to the right as soon as it is made.
//
// Partial sums travel on one channel, the last step's contributions on another. Partial sums
// land in 2*window staging slots, `window` of them posted ahead; a slot forwarded to the right
// is reused only after that send completed. Because the right neighbour consumes a forwarded
// segment one receive after it would consume the one sent before it, no rank ever waits for a
// neighbour to run ahead of it, whatever the number of segments. The last step's receives go
// straight into `out`, all posted at once, when `out` is not this rank's own contribution (an
// out-of-place reduce-scatter); otherwise (in place, all-reduce) through the staging slots.
void reduce_scatter_phase(Link& link, Scratch& scratch, const uint8_t* local, uint8_t* out,
                          const Chunks& ch, CommType type, ReduceOp op, size_t seg, size_t window,
                          const std::function<void(const Segment&)>& on_final) {
  const int n = link.size();
  const int r = link.rank();
  const int left = mod(r - 1, n);
  const int right = mod(r + 1, n);
  const size_t elem = comm_type_size(type);
  const size_t out_begin = ch.begin(r);
  const size_t nseg = (ch.len(0) + seg - 1) / seg;  // chunk 0 is the longest
  const auto o = reinterpret_cast<uintptr_t>(out);
  const auto l = reinterpret_cast<uintptr_t>(local);
  const bool final_to_out = o + ch.len(r) * elem <= l || l + ch.total * elem <= o;
  auto channel = [&](int step) { return step + 2 == n ? kFinalChannel : kPartialChannel; };

  struct Item {
    size_t slice;
    int step;
    Segment seg;
    bool staged;
  };
  std::vector<Item> items;     // the receives, in the order the left neighbour sends them
  std::vector<size_t> staged;  // indices of the items received through staging slots
  for (size_t j = 0; j < nseg; ++j) {
    for (int s = 0; s + 1 < n; ++s) {
      const Segment g = slice(ch, mod(r - s - 2, n), j, seg);
      if (g.len == 0) continue;
      const bool via_slot = s + 2 < n || !final_to_out;
      if (via_slot) staged.push_back(items.size());
      items.push_back({j, s, g, via_slot});
    }
  }

  Buffer direct = link.buffer(out, ch.len(r) * elem);
  if (final_to_out) {
    for (const Item& it : items) {
      if (!it.staged) {
        link.recv(direct, left, (it.seg.begin - out_begin) * elem, it.seg.len * elem,
                  kFinalChannel);
      }
    }
  }

  const size_t nslots = std::min(2 * window, staged.size());
  const size_t slot_bytes = seg * elem;
  uint8_t* staging = scratch.get(nslots * slot_bytes);
  std::vector<Buffer> slots;
  for (size_t k = 0; k < nslots; ++k)
    slots.push_back(link.buffer(staging + k * slot_bytes, slot_bytes));
  std::vector<char> forwarding(nslots, 0);
  auto post = [&](size_t q) {  // the q-th staged receive
    const Item& it = items[staged[q]];
    const size_t k = q % (2 * window);
    if (forwarding[k]) {
      link.wait_send(slots[k], right);
      forwarding[k] = 0;
    }
    link.recv(slots[k], left, 0, it.seg.len * elem, channel(it.step));
  };
  for (size_t q = 0; q < std::min(window, staged.size()); ++q) post(q);

  Buffer own = link.buffer(local, ch.total * elem);
  size_t own_sends = 0;
  size_t i = 0;  // next item
  size_t q = 0;  // next staged item
  for (size_t j = 0; j < nseg; ++j) {
    // Step 0 of segment j: this rank's own contribution to chunk r-1, as it is.
    const Segment g0 = slice(ch, mod(r - 1, n), j, seg);
    if (g0.len > 0) {
      link.send(own, right, g0.begin * elem, g0.len * elem, channel(0));
      ++own_sends;
    }
    for (; i < items.size() && items[i].slice == j; ++i) {
      const Item& it = items[i];
      const uint8_t* mine = local + it.seg.begin * elem;
      uint8_t* dst = out + (it.seg.begin - out_begin) * elem;
      if (!it.staged) {
        link.wait_recv(direct, left);
        reduce_into(dst, mine, it.seg.len, type, op);
        if (on_final) on_final(it.seg);
        continue;
      }
      const size_t k = q % (2 * window);
      uint8_t* in = staging + k * slot_bytes;
      link.wait_recv(slots[k], left);
      if (q + window < staged.size()) post(q + window);
      ++q;
      if (it.step + 2 < n) {
        reduce_into(in, mine, it.seg.len, type, op);
        link.send(slots[k], right, 0, it.seg.len * elem, channel(it.step + 1));
        forwarding[k] = 1;
      } else {
        reduce_to(dst, in, mine, it.seg.len, type, op);
        if (on_final) on_final(it.seg);
      }
    }
  }
  for (size_t k = 0; k < nslots; ++k) {
    if (forwarding[k]) link.wait_send(slots[k], right);
  }
  for (size_t m = 0; m < own_sends; ++m) link.wait_send(own, right);
}

}  // namespace

size_t Tuning::segment_elems(size_t chunk_elems, size_t elem) const {
  size_t bytes = segment_bytes;
  if (bytes == 0) bytes = std::clamp(chunk_elems * elem / 4, min_segment_bytes, max_segment_bytes);
  return std::max<size_t>(1, bytes / elem);
}

size_t Tuning::window_for(size_t seg_bytes) const {
  if (window > 0) return window;
  return std::clamp<size_t>(staging_bytes / 2 / std::max<size_t>(seg_bytes, 1), 4, 64);
}

uint8_t* Scratch::get(size_t bytes) {
  if (bytes > size_) {
    data_.reset();
    data_.reset(new uint8_t[bytes]);
    size_ = bytes;
  }
  return data_.get();
}

void ring_all_reduce(Link& link, Scratch& scratch, void* data, size_t count, CommType type,
                     ReduceOp op, const Tuning& tuning) {
  const int n = link.size();
  const int r = link.rank();
  if (n == 1 || count == 0) return;
  const int left = mod(r - 1, n);
  const int right = mod(r + 1, n);
  const size_t elem = comm_type_size(type);
  const Chunks ch{count, static_cast<size_t>(n)};
  const size_t seg = tuning.segment_elems(ch.len(0), elem);
  const size_t window = tuning.window_for(seg * elem);
  auto* d = static_cast<uint8_t*>(data);
  Buffer all = link.buffer(d, count * elem);

  // All-gather receives go straight to their place; step t brings chunk r-t-1.
  std::vector<Segment> gathered;
  for (int t = 0; t + 1 < n; ++t) {
    for_segments(ch, mod(r - t - 1, n), seg, [&](const Segment& g) { gathered.push_back(g); });
  }
  for (const auto& g : gathered) {
    link.recv(all, left, g.begin * elem, g.len * elem, kAllGatherChannel);
  }
  size_t sends = 0;
  reduce_scatter_phase(link, scratch, d, d + ch.begin(r) * elem, ch, type, op, seg, window,
                       [&](const Segment& g) {
                         link.send(all, right, g.begin * elem, g.len * elem, kAllGatherChannel);
                         ++sends;
                       });
  // Forward every gathered chunk except the last one (chunk r+1, whose owner is to the right).
  for (const auto& g : gathered) {
    link.wait_recv(all, left);
    if (g.chunk != right) {
      link.send(all, right, g.begin * elem, g.len * elem, kAllGatherChannel);
      ++sends;
    }
  }
  for (size_t i = 0; i < sends; ++i) link.wait_send(all, right);
}

void ring_reduce_scatter(Link& link, Scratch& scratch, const void* send, void* recv, size_t count,
                         CommType type, ReduceOp op, const Tuning& tuning) {
  const int n = link.size();
  const size_t elem = comm_type_size(type);
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  if (count == 0) return;
  if (n == 1) {
    if (in != out) std::memcpy(out, in, count * elem);
    return;
  }
  const Chunks ch{count * n, static_cast<size_t>(n)};
  const size_t seg = tuning.segment_elems(count, elem);
  reduce_scatter_phase(link, scratch, in, out, ch, type, op, seg, tuning.window_for(seg * elem),
                       nullptr);
}

void ring_all_gather(Link& link, const void* send, void* recv, size_t bytes, const Tuning& tuning) {
  const int n = link.size();
  const int r = link.rank();
  auto* out = static_cast<uint8_t*>(recv);
  if (bytes == 0) return;
  if (send != out + r * bytes) std::memcpy(out + r * bytes, send, bytes);
  if (n == 1) return;
  const int left = mod(r - 1, n);
  const int right = mod(r + 1, n);
  const size_t seg = tuning.segment_elems(bytes, 1);
  const Chunks ch{bytes * n, static_cast<size_t>(n)};
  Buffer all = link.buffer(out, bytes * n);

  std::vector<Segment> gathered;  // step t brings chunk r-t-1
  for (int t = 0; t + 1 < n; ++t) {
    for_segments(ch, mod(r - t - 1, n), seg, [&](const Segment& g) { gathered.push_back(g); });
  }
  for (const auto& g : gathered) link.recv(all, left, g.begin, g.len, kAllGatherChannel);
  size_t sends = 0;
  for_segments(ch, r, seg, [&](const Segment& g) {
    link.send(all, right, g.begin, g.len, kAllGatherChannel);
    ++sends;
  });
  for (const auto& g : gathered) {
    link.wait_recv(all, left);
    if (g.chunk != right) {
      link.send(all, right, g.begin, g.len, kAllGatherChannel);
      ++sends;
    }
  }
  for (size_t i = 0; i < sends; ++i) link.wait_send(all, right);
}

}  // namespace zerod::gloo_backend
