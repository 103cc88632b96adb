#include "parallel/tp_exchange.h"

namespace zerod {

TensorParallelExchange::TensorParallelExchange(Communicator& tensor_group, const Backend& backend)
    : comm_(tensor_group),
      type_(backend.compute_elem_size() == 4         ? CommType::kF32
            : backend.compute_dtype() == DType::kF16 ? CommType::kF16
                                                     : CommType::kBF16) {}

bool TensorParallelExchange::reduces_forward(ExchangePoint p) {
  return p == ExchangePoint::kEmbedding || p == ExchangePoint::kAttentionOut ||
         p == ExchangePoint::kMlpOut;
}

void TensorParallelExchange::forward(ExchangePoint p, void* x, int64_t n) {
  if (reduces_forward(p)) comm_.all_reduce(x, n, type_, ReduceOp::kSum);
}

void TensorParallelExchange::backward(ExchangePoint p, void* dx, int64_t n) {
  if (!reduces_forward(p)) comm_.all_reduce(dx, n, type_, ReduceOp::kSum);
}

void TensorParallelExchange::loss_max(float* x, int64_t n) {
  comm_.all_reduce(x, n, CommType::kF32, ReduceOp::kMax);
}

void TensorParallelExchange::loss_sum(float* x, int64_t n) {
  comm_.all_reduce(x, n, CommType::kF32, ReduceOp::kSum);
}

}  // namespace zerod
