// ZD_AVX2_BEGIN ... ZD_AVX2_END: the functions defined between them are compiled for AVX2 + FMA
// whatever the build's -march, so a kernel can have an AVX2 path picked at run time from
// cpu_info() (the AVX-512 twin of these macros is in gemm_avx512_target.h). Include every header
// before ZD_AVX2_BEGIN, for the reason given there.
#pragma once

// clang-format off
#if defined(__clang__)
#define ZD_AVX2_BEGIN _Pragma("clang attribute push(__attribute__((target(\"avx2,fma\"))), apply_to = function)")
#define ZD_AVX2_END _Pragma("clang attribute pop")
#else
#define ZD_AVX2_BEGIN                    \
  _Pragma("GCC push_options")            \
  _Pragma("GCC target(\"avx2,fma\")")
#define ZD_AVX2_END _Pragma("GCC pop_options")
#endif
// clang-format on
