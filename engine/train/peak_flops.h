// The FLOP/s that MFU is measured against: measured on the CPU, the datasheet on a GPU.
#pragma once

#include <string>

#include "core/dtype.h"

namespace zerod {

// The CPU's fp32 peak from the hardware: threads x clock x FLOP per cycle per core (2 FMA pipes
// of the widest vector unit: 64 with AVX-512, 32 with AVX2+FMA, 16 otherwise). The clock is
// cpuinfo_max_freq, else the highest "cpu MHz" of /proc/cpuinfo, else the "@ x.xxGHz" of the
// model name; 0 when none is known. *source says how it was computed. An upper bound, so MFU
// against it stays below 100% (a start-up sgemm on a busy machine is not: it was seen at 127%).
double cpu_hardware_peak_flops(int threads, std::string* source);

// Best of a few 1024^3 sgemm runs on the current OpenMP thread count: the rate the matmul
// engine actually reaches on this CPU (there is no reliable table of CPU peaks; a user can
// override it with train.peak_flops). Takes ~50 ms.
double measure_cpu_peak_flops();

// The dense tensor-core peak of a GPU named `name` (cudaDeviceProp::name, e.g. "NVIDIA H200")
// for matmuls in `dtype` (bf16/fp16; fp32 counts the FP32 CUDA-core peak: fp32 matmuls compute in
// true fp32, not TF32), from the vendor's datasheet; 0 for a GPU not in the table.
double gpu_peak_flops(const std::string& name, DType dtype);

}  // namespace zerod
