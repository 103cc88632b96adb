#include "comm/communicator.h"

#include <cstdint>
#include <optional>

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

void check_disjoint(const char* op, const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  ZD_CHECK(a_bytes == 0 || b_bytes == 0 || x >= y + b_bytes || y >= x + a_bytes,
           "{}: the buffers overlap ([{}, +{}) and [{}, +{}) bytes)", op, a, a_bytes, b, b_bytes);
}

size_t checked_send_recv_bytes(const void* send, int dst, const void* recv, int src, int64_t count,
                               CommType type, int rank, int size) {
  ZD_CHECK(dst == kNoPeer || (dst >= 0 && dst < size),
           "send_recv: destination rank {} outside a world of {} ranks", dst, size);
  ZD_CHECK(src == kNoPeer || (src >= 0 && src < size),
           "send_recv: source rank {} outside a world of {} ranks", src, size);
  ZD_CHECK((dst == rank) == (src == rank),
           "send_recv: rank {} sends to rank {} but receives from rank {} (a rank sends to itself "
           "exactly when it receives from itself)",
           rank, dst, src);
  ZD_CHECK(count >= 0, "send_recv: negative count {}", count);
  ZD_CHECK(static_cast<uint64_t>(count) <= static_cast<uint64_t>(INT64_MAX) / comm_type_size(type),
           "send_recv: {} elements of {} overflow", count, comm_type_name(type));
  ZD_CHECK(count == 0 || dst == kNoPeer || send != nullptr,
           "send_recv: null send buffer for {} elements to rank {}", count, dst);
  ZD_CHECK(count == 0 || src == kNoPeer || recv != nullptr,
           "send_recv: null recv buffer for {} elements from rank {}", count, src);
  const size_t bytes = static_cast<size_t>(count) * comm_type_size(type);
  if (dst != kNoPeer && src != kNoPeer) check_disjoint("send_recv", send, bytes, recv, bytes);
  return bytes;
}

const char* p2p_kind_name(P2POp::Kind k) {
  return k == P2POp::Kind::kSend ? "send" : "recv";
}

size_t checked_p2p_bytes(const P2POp& op, int rank, int size) {
  const char* name = p2p_kind_name(op.kind);
  ZD_CHECK(op.peer >= 0 && op.peer < size, "{}: peer rank {} outside a communicator of {} ranks",
           name, op.peer, size);
  ZD_CHECK(op.peer != rank,
           "{}: rank {} names itself as its peer (point-to-point messages go to another rank)",
           name, rank);
  ZD_CHECK(op.tag >= 0, "{}: negative tag {}", name, op.tag);
  return checked_collective_bytes(name, op.data, op.data, op.count, op.type, 1);
}

namespace {

// The Work of p2p_async's default: its messages' works, waited for in turn.
class BatchWork final : public Work {
 public:
  explicit BatchWork(std::vector<WorkPtr> works) : works_(std::move(works)) {}
  void wait() override {
    std::optional<Error> first;
    for (const WorkPtr& w : works_) {
      try {
        w->wait();
      } catch (const Error& e) {
        if (!first) first = e;
      }
    }
    if (first) throw *first;
  }
  bool done() const override {
    for (const WorkPtr& w : works_)
      if (!w->done()) return false;
    return true;
  }
  int64_t sequence() const override { return 0; }

 private:
  std::vector<WorkPtr> works_;
};

}  // namespace

WorkPtr Communicator::p2p_async(const std::vector<P2POp>& ops) {
  for (const P2POp& op : ops) checked_p2p_bytes(op, rank(), size());
  std::vector<WorkPtr> works;
  works.reserve(ops.size());
  for (const P2POp& op : ops) {
    works.push_back(op.kind == P2POp::Kind::kSend
                        ? send_async(op.data, op.count, op.type, op.peer, op.tag)
                        : recv_async(op.data, op.count, op.type, op.peer, op.tag));
  }
  return std::make_shared<BatchWork>(std::move(works));
}

}  // namespace zerod
