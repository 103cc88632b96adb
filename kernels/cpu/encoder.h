// Token + position embedding (the first op of a GPT), fp32.
#pragma once

#include <cstdint>

namespace zerod::cpu {

// out (B,T,C) = wte[tokens[b,t]] + wpe[t]; tokens (B,T) index rows of wte (Vp,C); wpe (>=T,C),
// or null for models without learned positions (out = wte[tokens]). A token < 0 has no row here
// (a vocabulary-parallel shard that does not hold it): its wte term is 0 (out = wpe[t], or 0).
// doc_start (B,T), or null: document masking, the position row of (b,t) is
// wpe[t - doc_start[b,t]] (0 <= doc_start[b,t] <= t; see AttentionShape::doc_start).
void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                     int T, int C, const int32_t* doc_start = nullptr);

// dwte (Vp,C) += and dwpe (T,C) += from dout (B,T,C); dwpe may be null (no position
// embedding). Positions whose token is < 0 add to dwpe only (no wte row, no wte gradient). Each
// output row is accumulated by one thread, positions in increasing order, so the result does not
// depend on the thread count (repeated tokens are summed in position order). With doc_start
// (as encoder_forward's) row (b,t) adds to dwpe[t - doc_start[b,t]]; each dwpe row then sums its
// rows in (b, t) order (threads split the channels).
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                      int T, int C, const int32_t* doc_start = nullptr);

}  // namespace zerod::cpu
