#include "parallel/tp_grads.h"

namespace zerod {

TensorParallelGrads::TensorParallelGrads(const ParamLayout& layout, GradSink& inner,
                                         Backend& backend)
    : inner_(inner), be_(backend), dropped_(static_cast<size_t>(layout.num_units())) {
  for (int u = 0; u < layout.num_units(); ++u) {
    for (const TensorInfo& t : layout.unit(u).tensors) {
      if (layout.drops_gradient(t))
        dropped_[static_cast<size_t>(u)].emplace_back(t.offset, t.offset + t.numel);
    }
  }
}

void TensorParallelGrads::unit_done(int unit) {
  const auto& ranges = dropped_.at(static_cast<size_t>(unit));
  if (!ranges.empty()) {
    char* g = static_cast<char*>(inner_.grad_buffer(unit));
    const size_t esz = be_.compute_elem_size();
    for (const auto& [b, e] : ranges)
      be_.memset_zero(g + static_cast<size_t>(b) * esz, static_cast<size_t>(e - b) * esz);
  }
  inner_.unit_done(unit);
}

}  // namespace zerod
