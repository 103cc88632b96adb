// The element types and reduction operations of the Communicator interface (comm/communicator.h)
// as NCCL's. Every CommType has an exact NCCL twin, so NCCL reduces in the element type itself:
// integer sums wrap like the Gloo backend's (u8 modulo 256), float sums round per addition.
// kBF16 maps to ncclBfloat16 (in NCCL since 2.10), kF16 to ncclFloat16.
#pragma once

#include <nccl.h>

#include "comm/communicator.h"
#include "core/error.h"

namespace zerod::nccl_backend {

inline ncclDataType_t nccl_type(CommType t) {
  switch (t) {
    case CommType::kF32:
      return ncclFloat32;
    case CommType::kF64:
      return ncclFloat64;
    case CommType::kI32:
      return ncclInt32;
    case CommType::kI64:
      return ncclInt64;
    case CommType::kU8:
      return ncclUint8;
    case CommType::kBF16:
      return ncclBfloat16;
    case CommType::kF16:
      return ncclFloat16;
  }
  ZD_THROW("unknown CommType {}", static_cast<int>(t));
}

inline ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMax:
      return ncclMax;
  }
  ZD_THROW("unknown ReduceOp {}", static_cast<int>(op));
}

}  // namespace zerod::nccl_backend
