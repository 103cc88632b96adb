// The vector loops of SGD, Adagrad, Lion (optim.h) and Lamb's two passes (lamb.h): the same IEEE
// operations as sgd_element, adagrad_element, lion_element, lamb_moments_element and
// lamb_direction, in the same order, 16 lanes (AVX-512) or 8 lanes (AVX2 + FMA) at a time, so
// every path equals the scalar definition bit for bit (as adamw_simd.h does for AdamW). Both exist
// in every build (optim_simd_avx512.cc, optim_simd_avx2.cc: compiled for their ISA whatever
// -march is); the callers pick one at run time with adamw_isa() (the CPU optimizer's path for
// every type). Each returns how many leading elements it updated (a multiple of its width); the
// caller finishes the tail with the scalar element functions.
#pragma once

#include <cstdint>

#include "kernels/cpu/lamb.h"
#include "kernels/cpu/optim.h"

namespace zerod::cpu::optim_simd {

enum class SgdVariant { kPlain, kMomentum, kNesterov };

// One ISA's spans. sgd: master, m (n); adagrad: master, v (n); lion: master, m (n).
// lamb_moments: m, v (n) updated, u (n) = the direction (the caller sums master^2 and u^2 in
// double, in element order). lamb_apply: master (n) -= scaled * lamb_direction(master, m, v).
struct Spans {
  int64_t (*sgd)(float* master, float* m, const float* grad, int64_t n, const OptimConstants& k,
                 SgdVariant variant);
  int64_t (*adagrad)(float* master, float* v, const float* grad, int64_t n,
                     const OptimConstants& k);
  int64_t (*lion)(float* master, float* m, const float* grad, int64_t n, const OptimConstants& k);
  int64_t (*lamb_moments)(const float* master, float* m, float* v, const float* grad, float* u,
                          int64_t n, const LambConstants& k);
  int64_t (*lamb_apply)(float* master, const float* m, const float* v, int64_t n, float scaled,
                        const LambConstants& k);
};

extern const Spans kAvx512;
extern const Spans kAvx2;

// The spans of adamw_isa() (AVX-512, AVX2), or null for the scalar path.
const Spans* current();

}  // namespace zerod::cpu::optim_simd
