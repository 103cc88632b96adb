#include "comm/nccl/nccl_error.h"

#include <fmt/format.h>

namespace zerod::nccl_backend {

namespace {

const char* nccl_result_name(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "ncclSuccess";
    case ncclUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case ncclSystemError:
      return "ncclSystemError";
    case ncclInternalError:
      return "ncclInternalError";
    case ncclInvalidArgument:
      return "ncclInvalidArgument";
    case ncclInvalidUsage:
      return "ncclInvalidUsage";
    case ncclRemoteError:
      return "ncclRemoteError";
    case ncclInProgress:
      return "ncclInProgress";
    default:
      return "ncclResult";
  }
}

}  // namespace

ErrorKind nccl_error_kind(ncclResult_t result) {
  return result == ncclRemoteError || result == ncclSystemError ? ErrorKind::kPeerLost
                                                                : ErrorKind::kInternal;
}

std::string nccl_error_text(ncclResult_t result, ncclComm_t comm) {
  std::string text = fmt::format("{} ({})", nccl_result_name(result), ncclGetErrorString(result));
  if (result != ncclSuccess && result != ncclInProgress) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && last[0] != '\0') text += fmt::format(": {}", last);
  }
  return text;
}

void nccl_check(ncclResult_t result, const std::string& what, ncclComm_t comm) {
  if (result == ncclSuccess) return;
  throw Error(nccl_error_kind(result), fmt::format("{}: {}", what, nccl_error_text(result, comm)),
              __FILE__, __LINE__);
}

std::string cuda_error_text(cudaError_t error) {
  return fmt::format("{} ({})", cudaGetErrorName(error), cudaGetErrorString(error));
}

void cuda_check(cudaError_t error, const std::string& what) {
  if (error == cudaSuccess) return;
  cudaGetLastError();
  ZD_THROW("{}: CUDA error {}", what, cuda_error_text(error));
}

}  // namespace zerod::nccl_backend
