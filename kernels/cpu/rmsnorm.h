// RMS normalisation over the last dimension (Llama family), fp32.
#pragma once

#include <cstdint>

namespace zerod::cpu {

// rstd (N) = 1 / sqrt(mean(inp[n,:]^2) + eps); out (N,C) = (inp * rstd) * weight.
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t N,
                     int C, float eps);

// dinp (N,C) +=, dweight (C) += from dout (N,C), with rstd of the forward. With
// norm = inp * rstd and dn = weight * dout: dinp += rstd * (dn - norm * mean(dn * norm)),
// dweight += sum over rows of norm * dout. The weight gradient is reduced over fixed row chunks
// combined in order (thread-count independent).
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int64_t N, int C);

}  // namespace zerod::cpu
