// The CommType of compute-dtype tensors as a backend stores them: fp32 arrays on the CPU backend
// (whatever the compute dtype), real 16-bit floats on a GPU backend's bf16 / fp16 storage.
#pragma once

#include "comm/communicator.h"
#include "kernels/backend.h"

namespace zerod {

inline CommType compute_comm_type(const Backend& be) {
  if (be.compute_elem_size() == 4) return CommType::kF32;
  return be.compute_dtype() == DType::kF16 ? CommType::kF16 : CommType::kBF16;
}

}  // namespace zerod
