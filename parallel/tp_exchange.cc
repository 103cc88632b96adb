#include "parallel/tp_exchange.h"

#include "core/error.h"

namespace zerod {

TensorParallelExchange::TensorParallelExchange(Communicator& tensor_group, const Backend& backend,
                                               bool sequence_parallel)
    : comm_(tensor_group),
      type_(backend.compute_elem_size() == 4         ? CommType::kF32
            : backend.compute_dtype() == DType::kF16 ? CommType::kF16
                                                     : CommType::kBF16),
      sequence_parallel_(sequence_parallel) {}

int64_t TensorParallelExchange::block(ExchangePoint p, int64_t rows, int64_t width) const {
  const int T = comm_.size();
  ZD_CHECK(rows % T == 0, "sequence parallelism at {}: {} rows do not split {} ways",
           exchange_point_name(p), rows, T);
  return rows / T * width;
}

void TensorParallelExchange::gather(ExchangePoint p, const void* part, void* full, int64_t rows,
                                    int64_t width) {
  comm_.all_gather(part, full, block(p, rows, width), type_);
}

void TensorParallelExchange::scatter(ExchangePoint p, const void* full, void* part, int64_t rows,
                                     int64_t width) {
  comm_.reduce_scatter(full, part, block(p, rows, width), type_, ReduceOp::kSum);
}

void TensorParallelExchange::forward(ExchangePoint p, void* part, void* full, int64_t rows,
                                     int64_t width) {
  const bool sums = exchange_sums_forward(p);
  if (!sequence_parallel_) {
    if (sums) comm_.all_reduce(full, rows * width, type_, ReduceOp::kSum);
    return;
  }
  if (sums) {
    scatter(p, full, part, rows, width);
  } else {
    gather(p, part, full, rows, width);
  }
}

void TensorParallelExchange::backward(ExchangePoint p, void* part, void* full, int64_t rows,
                                      int64_t width) {
  const bool sums = !exchange_sums_forward(p);
  if (!sequence_parallel_) {
    if (sums) comm_.all_reduce(full, rows * width, type_, ReduceOp::kSum);
    return;
  }
  if (sums) {
    scatter(p, full, part, rows, width);
  } else {
    gather(p, part, full, rows, width);
  }
}

void TensorParallelExchange::loss_max(float* x, int64_t n) {
  comm_.all_reduce(x, n, CommType::kF32, ReduceOp::kMax);
}

void TensorParallelExchange::loss_sum(float* x, int64_t n) {
  comm_.all_reduce(x, n, CommType::kF32, ReduceOp::kSum);
}

}  // namespace zerod
