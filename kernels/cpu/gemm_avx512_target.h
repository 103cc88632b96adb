// ZD_AVX512_BEGIN ... ZD_AVX512_END: the functions defined between them are compiled for
// AVX-512 (F, DQ, VL, BW) + FMA whatever the build's -march, so the AVX-512 SGEMM engine exists
// in every build and gemm.cc picks it at run time from cpu_info(). Include every header before
// ZD_AVX512_BEGIN: inline functions from headers must not be compiled for AVX-512 (the linker
// could keep that copy for callers on CPUs without it).
#pragma once

// clang-format off
#if defined(__clang__)
// _Pragma takes a single string literal, hence the long line.
#define ZD_AVX512_BEGIN _Pragma("clang attribute push(__attribute__((target(\"avx512f,avx512dq,avx512vl,avx512bw,fma,avx2\"))), apply_to = function)")
#define ZD_AVX512_END _Pragma("clang attribute pop")
#else
// GCC 12 also flags the deliberately undefined pass-through operand inside some AVX-512
// intrinsics as maybe-uninitialized; that warning is off inside the region.
#define ZD_AVX512_BEGIN                                                   \
  _Pragma("GCC push_options")                                             \
  _Pragma("GCC target(\"avx512f,avx512dq,avx512vl,avx512bw,fma,avx2\")")  \
  _Pragma("GCC diagnostic push")                                          \
  _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define ZD_AVX512_END _Pragma("GCC diagnostic pop") _Pragma("GCC pop_options")
#endif
// clang-format on
