// cuBLASLt, loaded when the first GPU matmul needs it (dlopen), not linked: a CUDA-enabled zerod
// then starts without it, and CPU jobs do not carry its ~160 MiB of resident pages (relocated data
// and file pages mapped at start; docs/benchmarks.md, CPU scaling). The entry points matmul.cc
// calls, resolved once; the declarations stay cublasLt.h's, so the calls read as before.
#pragma once

#include <cublasLt.h>

namespace zerod::cuda {

struct CublasLtLibrary {
  decltype(&cublasLtCreate) Create;
  decltype(&cublasLtDestroy) Destroy;
  decltype(&cublasLtGetStatusName) GetStatusName;
  decltype(&cublasLtGetStatusString) GetStatusString;
  decltype(&cublasLtMatmul) Matmul;
  decltype(&cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
  decltype(&cublasLtMatmulDescCreate) MatmulDescCreate;
  decltype(&cublasLtMatmulDescDestroy) MatmulDescDestroy;
  decltype(&cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
  decltype(&cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
  decltype(&cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
  decltype(&cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
  decltype(&cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy;
  decltype(&cublasLtGetVersion) GetVersion;
};

// The library, loaded on the first call (thread-safe): libcublasLt.so.<major of the headers>
// from the loader's search path, else from the CUDA toolkit's library folder of the build.
// Throws Error naming both places and dlopen's reasons when it is missing or lacks a symbol.
const CublasLtLibrary& cublaslt();

// The file cublaslt() loaded ("" before the first call).
const char* cublaslt_path();

}  // namespace zerod::cuda
