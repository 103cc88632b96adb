// Residual connection, fp32.
#pragma once

#include <cstdint>

namespace zerod::cpu {

// out (n) = a + b. out may alias a or b.
void residual_forward(float* out, const float* a, const float* b, int64_t n);

}  // namespace zerod::cpu
