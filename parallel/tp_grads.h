// The GradSink of a tensor-parallel rank (Megatron's gradient finalisation for the tensor
// group): forwards every call to the ZeRO engine's sink, after dropping the gradients of the
// tensors that only tensor rank 0 holds (model/shard.h: row-parallel biases, GPT-2's position
// embedding), which the other ranks keep at zero. Replicated tensors (norms) need nothing: the
// all-reduced input gradients make their gradients identical on every tensor rank, and the
// gradient norm counts them once (ParamLayout::counted_in_norm).
#pragma once

#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "model/layout.h"
#include "model/param_source.h"

namespace zerod {

class TensorParallelGrads final : public GradSink {
 public:
  // layout: this rank's (tensor-parallel) layout. inner, backend: not owned.
  TensorParallelGrads(const ParamLayout& layout, GradSink& inner, Backend& backend);

  void* grad_buffer(int unit) override { return inner_.grad_buffer(unit); }
  void unit_done(int unit) override;

 private:
  GradSink& inner_;
  Backend& be_;
  // Per unit: the [begin, end) element ranges whose gradients are dropped.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> dropped_;
};

}  // namespace zerod
