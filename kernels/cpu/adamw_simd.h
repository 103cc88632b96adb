// The vector loops of AdamW (adamw.h): the same IEEE operations as adamw_element, in the same
// order, 16 lanes (AVX-512) or 8 lanes (AVX2 + FMA) at a time, so every path equals the scalar
// definition bit for bit. Both exist in every build (compiled for their ISA whatever -march is);
// adamw.cc picks one at run time from cpu_info(). Each returns how many leading elements it
// updated (a multiple of its width); the caller finishes the tail with adamw_element.
#pragma once

#include <cstdint>

#include "kernels/cpu/adamw.h"

namespace zerod::cpu::adamw_simd {

int64_t span_avx512(float* master, float* m, float* v, const float* grad, int64_t n,
                    const AdamWConstants& k);
int64_t span_avx2(float* master, float* m, float* v, const float* grad, int64_t n,
                  const AdamWConstants& k);

}  // namespace zerod::cpu::adamw_simd
