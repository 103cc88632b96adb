// SwiGLU, the gated MLP activation of the Llama family, fp32:
// out = silu(gate) * up with silu(x) = x * sigmoid(x) = x / (1 + e^-x).
#pragma once

#include <cstdint>

namespace zerod::cpu {

// gu (N,2I): gate = columns [0,I), up = [I,2I) of each row; out (N,I) = silu(gate) * up.
void swiglu_forward(float* out, const float* gu, int64_t N, int I);

// dgu (N,2I) = (overwrite) dgate = dout * up * silu'(gate) in columns [0,I), dup =
// dout * silu(gate) in [I,2I); silu'(x) = sigmoid(x) (1 + x (1 - sigmoid(x))). dgu may alias gu
// (each element pair is read before it is written).
void swiglu_backward(float* dgu, const float* dout, const float* gu, int64_t N, int I);

}  // namespace zerod::cpu
