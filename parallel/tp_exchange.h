// Tensor parallelism's collectives at the model's exchange points (model/exchange.h), over the
// tensor group of T ranks: Megatron's conjugate pairs, without or with sequence parallelism.
//
//   point          forward                  backward
//                  plain       sequence     plain        sequence
//   embedding      all-reduce  reduce-scat  identity     all-gather
//   attention_in   identity    all-gather   all-reduce   reduce-scatter
//   attention_out  all-reduce  reduce-scat  identity     all-gather
//   mlp_in         identity    all-gather   all-reduce   reduce-scatter
//   mlp_out        all-reduce  reduce-scat  identity     all-gather
//   head_in        identity    all-gather   all-reduce   reduce-scatter
//
// Without sequence parallelism every collective is in place on `full` (part == full); with it
// the N rows are split into T contiguous blocks of N/T rows, rank r's block at r N/T (the
// communicator's block layout). The loss statistics of the vocabulary-parallel cross-entropy are
// all-reduced (max or sum) in fp32 either way. Tensors live in the backend's memory: the
// communicator must reach it (Gloo for the CPU backend, NCCL for a GPU's).
#pragma once

#include "comm/communicator.h"
#include "kernels/backend.h"
#include "model/exchange.h"

namespace zerod {

class TensorParallelExchange final : public Exchange {
 public:
  // tensor_group: the ranks holding the other parts of this rank's model (not owned).
  TensorParallelExchange(Communicator& tensor_group, const Backend& backend,
                         bool sequence_parallel = false);

  bool sequence_parallel() const override { return sequence_parallel_; }
  void forward(ExchangePoint p, void* part, void* full, int64_t rows, int64_t width) override;
  void backward(ExchangePoint p, void* part, void* full, int64_t rows, int64_t width) override;
  void loss_max(float* x, int64_t n) override;
  void loss_sum(float* x, int64_t n) override;

 private:
  // The elements of one rank's block of rows (sequence parallelism; rows must split T ways).
  int64_t block(ExchangePoint p, int64_t rows, int64_t width) const;
  // Sequence parallelism: all N rows from every rank's part, or the partial sums of all N rows
  // summed into this rank's part.
  void gather(ExchangePoint p, const void* part, void* full, int64_t rows, int64_t width);
  void scatter(ExchangePoint p, const void* full, void* part, int64_t rows, int64_t width);

  Communicator& comm_;
  CommType type_;
  bool sequence_parallel_;
};

}  // namespace zerod
