// Element-wise reductions of the CPU collectives (comm/gloo/): sum and max over the CommTypes.
// Element-wise only (no horizontal sums), so the result of every element does not depend on the
// vector width, and a chunk reduced once and then copied is bit-identical on every rank.
// Max propagates NaN (a NaN on any rank gives NaN), which overflow flags rely on.
#pragma once

#include <cstddef>
#include <cstdint>

#include "comm/communicator.h"

namespace zerod::gloo_backend {

// dst (count) = dst op src (count).
void reduce_into(void* dst, const void* src, size_t count, CommType type, ReduceOp op);
// dst (count) = a op b (count each); dst may alias a or b.
void reduce_to(void* dst, const void* a, const void* b, size_t count, CommType type, ReduceOp op);

// out (count) = x(0) op x(1) op ... op x(n-1), n >= 2, folded left in rank order so every rank
// computes the same bits. `acc` (count elements of scratch, unused when n == 2) holds partial
// results; out may alias any x (each x(q) is read before out is written, except x(n-1), which
// the last step reads while writing out elementwise).
template <class X>
void fold_in_rank_order(int n, X x, uint8_t* acc, uint8_t* out, size_t count, CommType type,
                        ReduceOp op) {
  if (n == 2) {
    reduce_to(out, x(0), x(1), count, type, op);
    return;
  }
  reduce_to(acc, x(0), x(1), count, type, op);
  for (int q = 2; q + 1 < n; ++q) reduce_into(acc, x(q), count, type, op);
  reduce_to(out, acc, x(n - 1), count, type, op);
}

}  // namespace zerod::gloo_backend
