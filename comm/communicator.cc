#include "comm/communicator.h"

#include <cstdint>

#include "core/error.h"

namespace zerod {

size_t comm_type_size(CommType t) {
  switch (t) {
    case CommType::kF32:
      return 4;
    case CommType::kF64:
      return 8;
    case CommType::kI32:
      return 4;
    case CommType::kI64:
      return 8;
    case CommType::kU8:
      return 1;
    case CommType::kBF16:
    case CommType::kF16:
      return 2;
  }
  ZD_THROW("unknown CommType {}", static_cast<int>(t));
}

const char* comm_type_name(CommType t) {
  switch (t) {
    case CommType::kF32:
      return "f32";
    case CommType::kF64:
      return "f64";
    case CommType::kI32:
      return "i32";
    case CommType::kI64:
      return "i64";
    case CommType::kU8:
      return "u8";
    case CommType::kBF16:
      return "bf16";
    case CommType::kF16:
      return "f16";
  }
  ZD_THROW("unknown CommType {}", static_cast<int>(t));
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
  }
  ZD_THROW("unknown ReduceOp {}", static_cast<int>(op));
}

size_t checked_collective_bytes(const char* op, const void* a, const void* b, int64_t count,
                                CommType type, int64_t ranks) {
  ZD_CHECK(count >= 0, "{}: negative count {}", op, count);
  ZD_CHECK(count == 0 || (a != nullptr && b != nullptr), "{}: null buffer for {} elements", op,
           count);
  const auto limit = static_cast<uint64_t>(INT64_MAX) / comm_type_size(type) / ranks;
  ZD_CHECK(static_cast<uint64_t>(count) <= limit, "{}: {} elements of {} overflow", op, count,
           comm_type_name(type));
  return static_cast<size_t>(count) * comm_type_size(type);
}

}  // namespace zerod
