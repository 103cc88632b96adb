// Element-wise reductions of the CPU collectives (comm/gloo/): sum and max over the CommTypes.
// Element-wise only (no horizontal sums), so the result of every element does not depend on the
// vector width, and a chunk reduced once and then copied is bit-identical on every rank.
// Max propagates NaN (a NaN on any rank gives NaN), which overflow flags rely on.
#pragma once

#include <cstddef>

#include "comm/communicator.h"

namespace zerod::gloo_backend {

// dst (count) = dst op src (count).
void reduce_into(void* dst, const void* src, size_t count, CommType type, ReduceOp op);
// dst (count) = a op b (count each); dst may alias a or b.
void reduce_to(void* dst, const void* a, const void* b, size_t count, CommType type, ReduceOp op);

}  // namespace zerod::gloo_backend
