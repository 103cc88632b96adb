// Layer normalisation over the last dimension (eps 1e-5, biased variance), fp32.
#pragma once

#include <cstdint>

namespace zerod::cpu {

constexpr float kLayerNormEps = 1e-5f;

// out (N,C) = (inp - mean) * rstd * weight + bias; mean (N) =, rstd (N) = 1/sqrt(var + eps).
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t N, int C);

// dinp (N,C) +=, dweight (C) +=, dbias (C) += from dout (N,C), with mean/rstd of the forward.
// The weight/bias gradients are reduced over fixed row chunks combined in order (thread-count
// independent).
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int64_t N, int C);

}  // namespace zerod::cpu
