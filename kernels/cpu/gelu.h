// GELU, tanh approximation: gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), fp32.
#pragma once

#include <cstdint>

namespace zerod::cpu {

// out (n) = gelu(inp). out may alias inp.
void gelu_forward(float* out, const float* inp, int64_t n);

// dinp (n) = gelu'(inp) * dout (overwrite). dinp may alias dout.
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n);

}  // namespace zerod::cpu
