#include "parallel/tp_grads.h"

#include <algorithm>

#include "core/error.h"

namespace zerod {

TensorParallelGrads::TensorParallelGrads(const ParamLayout& layout, GradSink& inner,
                                         Backend& backend, Communicator* tensor_group)
    : inner_(inner),
      be_(backend),
      comm_(tensor_group),
      type_(backend.compute_elem_size() == 4         ? CommType::kF32
            : backend.compute_dtype() == DType::kF16 ? CommType::kF16
                                                     : CommType::kBF16),
      dropped_(static_cast<size_t>(layout.num_units())),
      summed_(static_cast<size_t>(layout.num_units())),
      open_(static_cast<size_t>(layout.num_units()), 0) {
  const TensorShard& shard = layout.shard();
  const bool sum_replicated = shard.sequence_parallel && shard.size > 1;
  ZD_CHECK(!sum_replicated || (comm_ != nullptr && comm_->size() == shard.size),
           "sequence-parallel gradients of tensor rank {} need the tensor group of {} ranks",
           shard.rank, shard.size);
  for (int u = 0; u < layout.num_units(); ++u) {
    const auto& tensors = layout.unit(u).tensors;
    for (const TensorInfo& t : tensors) {
      if (layout.drops_gradient(t))
        dropped_[static_cast<size_t>(u)].emplace_back(t.offset, t.offset + t.numel);
    }
    if (!sum_replicated) continue;
    // Replicated tensors in offset order; neighbours (only alignment padding between them, which
    // stays zero) become one range: one all-reduce per run of norms.
    std::vector<const TensorInfo*> order;
    for (const TensorInfo& t : tensors) order.push_back(&t);
    std::sort(order.begin(), order.end(),
              [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
    Ranges& ranges = summed_[static_cast<size_t>(u)];
    bool extend = false;
    for (const TensorInfo* t : order) {
      if (t->split != Split::kReplicated) {
        extend = false;
        continue;
      }
      if (extend) {
        ranges.back().second = t->offset + t->numel;
      } else {
        ranges.emplace_back(t->offset, t->offset + t->numel);
      }
      extend = true;
    }
  }
}

void* TensorParallelGrads::grad_buffer(int unit) {
  void* g = inner_.grad_buffer(unit);
  char& open = open_.at(static_cast<size_t>(unit));
  if (!open) {
    open = 1;
    // The sum so far (identical on every rank) / T: the all-reduce at unit_done restores it.
    const size_t esz = be_.compute_elem_size();
    for (const auto& [b, e] : summed_[static_cast<size_t>(unit)])
      be_.scale(static_cast<char*>(g) + static_cast<size_t>(b) * esz,
                1.0f / static_cast<float>(comm_->size()), e - b);
  }
  return g;
}

void TensorParallelGrads::unit_done(int unit) {
  const Ranges& summed = summed_.at(static_cast<size_t>(unit));
  const Ranges& dropped = dropped_[static_cast<size_t>(unit)];
  if (!summed.empty() || !dropped.empty()) {
    const size_t esz = be_.compute_elem_size();
    char* g = static_cast<char*>(grad_buffer(unit));  // (opens a unit the model never asked for)
    for (const auto& [b, e] : summed) {
      comm_->all_reduce(g + static_cast<size_t>(b) * esz, e - b, type_, ReduceOp::kSum);
      be_.round_to_compute(g + static_cast<size_t>(b) * esz, e - b);  // (emulated 16-bit sums)
    }
    for (const auto& [b, e] : dropped)
      be_.memset_zero(g + static_cast<size_t>(b) * esz, static_cast<size_t>(e - b) * esz);
  }
  open_[static_cast<size_t>(unit)] = 0;
  inner_.unit_done(unit);
}

}  // namespace zerod
