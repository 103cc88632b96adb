// Muon (torch.optim.Muon, torch >= 2.9: torch/optim/_muon.py) over fp32 matrices: the momentum
// and Nesterov blend element by element, Newton-Schulz orthogonalisation of a whole matrix on
// sgemm (kernels/cpu/gemm.h: the AVX-512 engine or OpenBLAS), the learning-rate adjustment by
// shape, and the decoupled-decay update. zero/muon_exchange.h brings each matrix whole to one
// rank under ZeRO; this file does the arithmetic.
//
// One deliberate difference from torch: torch casts the matrix to bf16 for Newton-Schulz; here it
// runs in fp32 (the requirement, and what torch computes for an fp32 reference without
// the cast). Each other operation is torch's, in its order (lerp as torch's CPU kernel, the
// weight update as mul_ then add_ with alpha; muon.cc is compiled without fp contraction).
#pragma once

#include <cmath>
#include <cstdint>

#include "core/dtype.h"

namespace zerod::cpu {

// torch's adjust_lr_fn: None / "original" (Keller Jordan: sqrt(max(1, A / B))) or
// "match_rms_adamw" (Moonshot: 0.2 * sqrt(max(A, B))), for a matrix of A rows and B columns.
enum class MuonLrAdjust : uint8_t { kOriginal, kMatchRmsAdamw };

struct MuonNs {
  float a = 3.4445f, b = -4.775f, c = 2.0315f;  // ns_coefficients
  float eps = 1e-7f;                            // the norm is clamped to at least eps
  int steps = 5;                                // ns_steps
};

// torch's lerp(start, end, w) on the CPU, each branch one fma as its vectorised kernel:
// w < 0.5 ? start + w * (end - start) : end - (end - start) * (1 - w).
inline float lerp(float start, float end, float w) {
  const float d = end - start;
  return w < 0.5f ? std::fma(w, d, start) : std::fma(-d, 1.0f - w, end);
}

// The momentum of n elements of one matrix: g = grad * grad_scale; m = lerp(m, g, 1 - momentum);
// update (n) = nesterov ? lerp(g, m, momentum) : m. grad is fp32.
void muon_momentum(float* m, const float* grad, float* update, int64_t n, float grad_scale,
                   double momentum, bool nesterov);

// x (rows, cols) = NS(x) in place: the transpose when rows > cols, divided by
// max(||x||_F, eps), ns.steps iterations of A = X X^T; B = b A + c A A; X = a X + B X, then
// transposed back. work: at least muon_ns_work_floats(rows, cols) floats.
void newton_schulz(float* x, int64_t rows, int64_t cols, const MuonNs& ns, float* work);
int64_t muon_ns_work_floats(int64_t rows, int64_t cols);
// Floating-point operations of newton_schulz (the load balance of the owners).
double muon_ns_flops(int64_t rows, int64_t cols, int steps);

// The learning rate of a (rows, cols) matrix (torch's _adjust_lr, in double).
double muon_adjusted_lr(double lr, MuonLrAdjust adjust, int64_t rows, int64_t cols);

// master (n) = master * (1 - lr * weight_decay) - adjusted_lr * ortho (n): torch's param.mul_
// then param.add_(update, alpha=-adjusted_lr) (one fma). param_out (n, may be null) = the new
// master rounded to param_dtype.
void muon_apply(float* master, const float* ortho, float* param_out, int64_t n, double lr,
                double weight_decay, double adjusted_lr, DType param_dtype);

}  // namespace zerod::cpu
