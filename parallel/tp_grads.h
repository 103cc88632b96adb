// The GradSink of a tensor-parallel rank (Megatron's gradient finalisation for the tensor
// group): forwards every call to the ZeRO engine's sink, after
//   - dropping the gradients of the tensors that only tensor rank 0 holds (model/shard.h:
//     row-parallel biases, GPT-2's position embedding), which the other ranks keep at zero;
//   - under sequence parallelism, summing the gradients of the replicated tensors (norms) over
//     the tensor group: each rank saw only its N/T rows, so its gradient is a partial sum.
// Without sequence parallelism replicated tensors need nothing: the all-reduced input gradients
// make their gradients identical on every tensor rank. Either way the gradient norm counts them
// once (ParamLayout::counted_in_norm).
//
// The sum happens at every unit_done, also on micro-batches that only accumulate (stages 0-1
// keep adding into the same buffer until the last one): when a unit's buffer is first handed
// out, its replicated ranges (then identical on every rank, the sum so far) are divided by T, so
// the all-reduce at unit_done yields the sum so far plus the sum of this micro-batch's partials.
#pragma once

#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "kernels/backend.h"
#include "model/layout.h"
#include "model/param_source.h"

namespace zerod {

class TensorParallelGrads final : public GradSink {
 public:
  // layout: this rank's (tensor-parallel) layout. inner, backend, tensor_group: not owned;
  // tensor_group is required when the layout's shard is sequence-parallel.
  TensorParallelGrads(const ParamLayout& layout, GradSink& inner, Backend& backend,
                      Communicator* tensor_group = nullptr);

  void* grad_buffer(int unit) override;
  void unit_done(int unit) override;

 private:
  using Ranges = std::vector<std::pair<int64_t, int64_t>>;  // [begin, end) elements of a unit

  GradSink& inner_;
  Backend& be_;
  Communicator* comm_;
  CommType type_;
  std::vector<Ranges> dropped_;  // per unit: gradients dropped (rank-0-only tensors elsewhere)
  std::vector<Ranges> summed_;   // per unit: gradients summed over the group (sequence parallel)
  std::vector<char> open_;       // per unit: handed out since the last unit_done
};

}  // namespace zerod
