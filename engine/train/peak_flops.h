// The FLOP/s that MFU is measured against on the CPU backend.
#pragma once

namespace zerod {

// Best of a few 1024^3 sgemm runs on the current OpenMP thread count: the rate the matmul
// engine actually reaches on this CPU (there is no reliable table of CPU peaks; a user can
// override it with train.peak_flops). Takes ~50 ms.
double measure_cpu_peak_flops();

}  // namespace zerod
