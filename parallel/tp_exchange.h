// Tensor parallelism's collectives at the model's exchange points (model/exchange.h), over the
// tensor group: Megatron's conjugate pairs without sequence parallelism.
//
//   point          forward            backward
//   embedding      all-reduce (sum)   identity
//   attention_in   identity           all-reduce of the input gradient
//   attention_out  all-reduce         identity
//   mlp_in         identity           all-reduce
//   mlp_out        all-reduce         identity
//   head_in        identity           all-reduce
//
// The loss statistics of the vocabulary-parallel cross-entropy are all-reduced (max or sum) in
// fp32. Tensors live in the backend's memory: the communicator must reach it (Gloo for the CPU
// backend, NCCL for a GPU's).
#pragma once

#include "comm/communicator.h"
#include "kernels/backend.h"
#include "model/exchange.h"

namespace zerod {

class TensorParallelExchange final : public Exchange {
 public:
  // tensor_group: the ranks holding the other parts of this rank's model (not owned).
  TensorParallelExchange(Communicator& tensor_group, const Backend& backend);

  void forward(ExchangePoint p, void* x, int64_t n) override;
  void backward(ExchangePoint p, void* dx, int64_t n) override;
  void loss_max(float* x, int64_t n) override;
  void loss_sum(float* x, int64_t n) override;

  // True when point p all-reduces in the forward (else in the backward).
  static bool reduces_forward(ExchangePoint p);

 private:
  Communicator& comm_;
  CommType type_;
};

}  // namespace zerod
