// NCCL and CUDA results as zerod::Error (core/error.h). A failing NCCL result means a lost peer
// (kPeerLost, exit code 3) when NCCL blames a remote rank or the network (ncclRemoteError,
// ncclSystemError); anything else (invalid arguments or usage, an internal or CUDA failure) is a
// bug or a broken machine (kInternal).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

#include "core/error.h"

namespace zerod::nccl_backend {

ErrorKind nccl_error_kind(ncclResult_t result);

// "ncclRemoteError (remote process exited or there was a network error): <NCCL's last error
// message, when it has one>".
std::string nccl_error_text(ncclResult_t result, ncclComm_t comm = nullptr);

// Throws Error(nccl_error_kind(result)) "<what>: <nccl_error_text>" unless result is ncclSuccess.
void nccl_check(ncclResult_t result, const std::string& what, ncclComm_t comm = nullptr);

// "cudaErrorInvalidDevice (invalid device ordinal)".
std::string cuda_error_text(cudaError_t error);

// Throws Error(kInternal) "<what>: CUDA error <cuda_error_text>" unless error is cudaSuccess (and
// clears the runtime's last error, so that later checks of the caller do not see it again).
void cuda_check(cudaError_t error, const std::string& what);

}  // namespace zerod::nccl_backend
