// Gloo's own collectives through its options API (see algorithms.h).
#include <gloo/allgather.h>
#include <gloo/allreduce.h>

#include "comm/gloo/algorithms.h"
#include "comm/gloo/reduce.h"
#include "core/error.h"

namespace zerod::gloo_backend {

namespace {

template <typename T>
void all_reduce_typed(const std::shared_ptr<gloo::Context>& context, void* data, size_t count,
                      CommType type, ReduceOp op, uint32_t tag, std::chrono::milliseconds timeout) {
  gloo::AllreduceOptions opts(context);
  opts.setOutput(static_cast<T*>(data), count);
  opts.setReduceFunction([type, op](void* c, const void* a, const void* b, size_t n) {
    reduce_to(c, a, b, n, type, op);
  });
  opts.setTag(tag);
  opts.setTimeout(timeout);
  gloo::allreduce(opts);
}

}  // namespace

void gloo_all_reduce(const std::shared_ptr<gloo::Context>& context, void* data, size_t count,
                     CommType type, ReduceOp op, uint32_t tag, std::chrono::milliseconds timeout) {
  if (count == 0) return;
  switch (type) {
    case CommType::kF32:
      return all_reduce_typed<float>(context, data, count, type, op, tag, timeout);
    case CommType::kF64:
      return all_reduce_typed<double>(context, data, count, type, op, tag, timeout);
    case CommType::kI32:
      return all_reduce_typed<int32_t>(context, data, count, type, op, tag, timeout);
    case CommType::kI64:
      return all_reduce_typed<int64_t>(context, data, count, type, op, tag, timeout);
    case CommType::kU8:
      return all_reduce_typed<uint8_t>(context, data, count, type, op, tag, timeout);
    case CommType::kBF16:  // (refused when the collective is issued: check_reducible)
    case CommType::kF16:
      break;
  }
  ZD_THROW("cannot reduce CommType {}", comm_type_name(type));
}

void gloo_all_gather(const std::shared_ptr<gloo::Context>& context, const void* send, void* recv,
                     size_t bytes, uint32_t tag, std::chrono::milliseconds timeout) {
  if (bytes == 0) return;
  auto* out = static_cast<uint8_t*>(recv);
  gloo::AllgatherOptions opts(context);
  if (send != out + context->rank * bytes) {
    opts.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(send)), bytes);
  }
  opts.setOutput(out, bytes * context->size);
  opts.setTag(tag);
  opts.setTimeout(timeout);
  gloo::allgather(opts);
}

}  // namespace zerod::gloo_backend
