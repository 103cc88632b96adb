#include "kernels/cpu/muon.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/cast.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel.h"

namespace zerod::cpu {

void muon_momentum(float* m, const float* grad, float* update, int64_t n, float grad_scale,
                   double momentum, bool nesterov) {
  // torch passes the weights as Python floats; its CPU kernel computes in float.
  const float to_grad = static_cast<float>(1.0 - momentum), mu = static_cast<float>(momentum);
#pragma omp parallel for schedule(static) if (n >= kParallelMinElems)
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] * grad_scale;
    m[i] = lerp(m[i], g, to_grad);
    update[i] = nesterov ? lerp(g, m[i], mu) : m[i];
  }
}

int64_t muon_ns_work_floats(int64_t rows, int64_t cols) {
  const int64_t r = std::min(rows, cols), c = std::max(rows, cols);
  return 2 * r * c + 3 * r * r;
}

double muon_ns_flops(int64_t rows, int64_t cols, int steps) {
  const double r = static_cast<double>(std::min(rows, cols));
  const double c = static_cast<double>(std::max(rows, cols));
  return steps * (4.0 * r * r * c + 2.0 * r * r * r);
}

void newton_schulz(float* x, int64_t rows, int64_t cols, const MuonNs& ns, float* work) {
  ZD_CHECK(ns.steps >= 0 && ns.steps < 100, "ns_steps {} must be in [0, 100)", ns.steps);
  const bool tall = rows > cols;
  const int64_t r = tall ? cols : rows, c = tall ? rows : cols;  // X (r, c), r <= c
  float* X = work;                                               // (r, c)
  float* Y = X + r * c;                                          // (r, c): B X
  float* A = Y + r * c;                                          // (r, r): X X^T
  float* cA = A + r * r;                                         // (r, r): c * A
  float* B = cA + r * r;                                         // (r, r): b * A + (c * A) A
  if (tall) {
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) X[j * rows + i] = x[i * cols + j];
  } else {
    std::copy(x, x + r * c, X);
  }
  // ||X||_F (accumulated in double, rounded once), clamped to at least eps.
  double ss = 0;
  for (int64_t i = 0; i < r * c; ++i) ss += static_cast<double>(X[i]) * X[i];
  const float norm = std::max(static_cast<float>(std::sqrt(ss)), ns.eps);
  for (int64_t i = 0; i < r * c; ++i) X[i] = X[i] / norm;
  for (int s = 0; s < ns.steps; ++s) {
    sgemm(false, true, r, r, c, 1.0f, X, c, X, c, 0.0f, A, r);  // A = X X^T
    // torch: b * A + c * A @ A, i.e. (c * A) @ A; then a * X + B @ X.
    for (int64_t i = 0; i < r * r; ++i) cA[i] = ns.c * A[i];
    sgemm(false, false, r, r, r, 1.0f, cA, r, A, r, 0.0f, B, r);
    for (int64_t i = 0; i < r * r; ++i) B[i] = ns.b * A[i] + B[i];
    sgemm(false, false, r, c, r, 1.0f, B, r, X, c, 0.0f, Y, c);
    for (int64_t i = 0; i < r * c; ++i) X[i] = ns.a * X[i] + Y[i];
  }
  if (tall) {
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) x[i * cols + j] = X[j * rows + i];
  } else {
    std::copy(X, X + r * c, x);
  }
}

double muon_adjusted_lr(double lr, MuonLrAdjust adjust, int64_t rows, int64_t cols) {
  const double A = static_cast<double>(rows), B = static_cast<double>(cols);
  if (adjust == MuonLrAdjust::kMatchRmsAdamw) return lr * (0.2 * std::sqrt(std::max(A, B)));
  return lr * std::sqrt(std::max(1.0, A / B));
}

void muon_apply(float* master, const float* ortho, float* param_out, int64_t n, double lr,
                double weight_decay, double adjusted_lr, DType param_dtype) {
  const float decay = static_cast<float>(1.0 - lr * weight_decay);
  const float neg_lr = static_cast<float>(-adjusted_lr);
#pragma omp parallel for schedule(static) if (n >= kParallelMinElems)
  for (int64_t i = 0; i < n; ++i) master[i] = std::fma(neg_lr, ortho[i], master[i] * decay);
  if (param_out != nullptr) cast_round(param_out, master, n, param_dtype);
}

}  // namespace zerod::cpu
