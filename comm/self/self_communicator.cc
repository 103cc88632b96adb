#include "comm/self/self_communicator.h"

#include <cstring>

#include "core/error.h"

namespace zerod {

namespace {

class DoneWork : public Work {
 public:
  explicit DoneWork(int64_t seq) : seq_(seq) {}
  void wait() override {}
  bool done() const override { return true; }
  int64_t sequence() const override { return seq_; }

 private:
  int64_t seq_;
};

size_t checked_bytes(const void* a, const void* b, int64_t count, CommType type, const char* op) {
  ZD_CHECK(count >= 0, "{}: negative count {}", op, count);
  ZD_CHECK(count == 0 || (a != nullptr && b != nullptr), "{}: null buffer for {} elements", op,
           count);
  return static_cast<size_t>(count) * comm_type_size(type);
}

}  // namespace

SelfCommunicator::SelfCommunicator(std::chrono::milliseconds timeout,
                                   std::shared_ptr<PeerMonitor> monitor, Copy copy)
    : timeout_(timeout), monitor_(std::move(monitor)), copy_(std::move(copy)) {}

WorkPtr SelfCommunicator::complete(const void* src, void* dst, size_t bytes) {
  const int64_t seq = ++seq_;
  if (monitor_) monitor_->on_start(0, seq);
  if (bytes > 0 && src != dst) {
    if (copy_) {
      copy_(dst, src, bytes);
    } else {
      std::memmove(dst, src, bytes);
    }
  }
  if (monitor_) monitor_->on_complete(0, seq);
  return std::make_shared<DoneWork>(seq);
}

WorkPtr SelfCommunicator::all_reduce_async(void* data, int64_t count, CommType type, ReduceOp op) {
  checked_bytes(data, data, count, type, "all_reduce");
  reduce_op_name(op);  // validates op
  return complete(nullptr, nullptr, 0);
}

WorkPtr SelfCommunicator::reduce_scatter_async(const void* send, void* recv, int64_t count,
                                               CommType type, ReduceOp op) {
  const size_t bytes = checked_bytes(send, recv, count, type, "reduce_scatter");
  reduce_op_name(op);
  return complete(send, recv, bytes);
}

WorkPtr SelfCommunicator::all_gather_async(const void* send, void* recv, int64_t count,
                                           CommType type) {
  return complete(send, recv, checked_bytes(send, recv, count, type, "all_gather"));
}

WorkPtr SelfCommunicator::broadcast_async(void* data, int64_t count, CommType type, int root) {
  checked_bytes(data, data, count, type, "broadcast");
  ZD_CHECK(root == 0, "broadcast: root {} outside a world of 1 rank", root);
  return complete(nullptr, nullptr, 0);
}

WorkPtr SelfCommunicator::barrier_async() {
  return complete(nullptr, nullptr, 0);
}

WorkPtr SelfCommunicator::all_to_all_async(const void* send, void* recv, int64_t count,
                                           CommType type) {
  const size_t bytes = checked_bytes(send, recv, count, type, "all_to_all");
  check_disjoint("all_to_all", send, bytes, recv, bytes);
  return complete(send, recv, bytes);
}

WorkPtr SelfCommunicator::send_recv_async(const void* send, int dst, void* recv, int src,
                                          int64_t count, CommType type) {
  const size_t bytes = checked_send_recv_bytes(send, dst, recv, src, count, type, 0, 1);
  if (dst == kNoPeer) return complete(nullptr, nullptr, 0);
  return complete(send, recv, bytes);
}

WorkPtr SelfCommunicator::send_async(const void* data, int64_t count, CommType type, int dst,
                                     int tag) {
  checked_p2p_bytes(P2POp{P2POp::Kind::kSend, const_cast<void*>(data), count, type, dst, tag}, 0,
                    1);
  ZD_THROW("send: unreachable in a world of one rank");
}

WorkPtr SelfCommunicator::recv_async(void* data, int64_t count, CommType type, int src, int tag) {
  checked_p2p_bytes(P2POp{P2POp::Kind::kRecv, data, count, type, src, tag}, 0, 1);
  ZD_THROW("recv: unreachable in a world of one rank");
}

}  // namespace zerod
