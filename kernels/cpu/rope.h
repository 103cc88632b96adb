// Rotary position embedding, Hugging Face's rotate-half convention (Llama family), fp32.
//
// Applied in place to the q and k heads (the first NH + KVH heads, HS channels each) of every
// qkv row (B,T,(NH+2*KVH)*HS, see kernels/cpu/attention.h); the v heads are untouched. For each
// head x and i < HS/2, with c = cos[t,i], s = sin[t,i] of the row's position t:
//   (x[i], x[i+HS/2]) = (x[i] c - x[i+HS/2] s, x[i+HS/2] c + x[i] s).
#pragma once

#include "kernels/backend.h"

namespace zerod::cpu {

// The rotation above, in place on qkv; cos, sin (T, HS/2) fp32. HS must be even. With
// s.doc_start (document masking) row (b,t) takes the table row t - doc_start[b,t].
void rope_forward(float* qkv, const float* cos, const float* sin, const AttentionShape& s);

// The inverse (transposed) rotation, in place on the q and k heads of dqkv:
//   (d[i], d[i+HS/2]) = (d[i] c + d[i+HS/2] s, d[i+HS/2] c - d[i] s).
void rope_backward(float* dqkv, const float* cos, const float* sin, const AttentionShape& s);

}  // namespace zerod::cpu
