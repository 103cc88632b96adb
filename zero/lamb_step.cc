// ZeroEngine::lamb_step: DeepSpeed FusedLamb's step on this rank's optimizer shard.
//
// Lamb scales each tensor's update by its trust ratio ||w|| / ||u||, norms of the WHOLE tensor,
// while under ZeRO stages 1-3 a tensor may be split between ranks' shards (and a shard holds
// pieces of several tensors; NVMe offload visits a shard a sub-group at a time; with
// offload_ratio < 1 a shard lies part on the host, part on the device). No tensor is gathered:
//   pass 1  every piece of every tensor this rank holds: m, v updated, and the piece's sums of
//           w^2 (before the step) and u^2 added to the tensor's entry of a vector of 2 x tensors
//           doubles;
//   reduce  at stages 1-3 one all-reduce (sum) of that vector over the data-parallel group, so
//           every rank has every tensor's norms (stage 0: every rank holds every tensor whole);
//           with expert parallelism the experts units' entries sum over their own
//           expert-data-parallel group instead (their shards are split over it);
//   pass 2  every piece: master -= step_size * clamp(||w|| / ||u||) * u.
// Pass 2 recomputes u from the updated m, v and the unchanged master, as DeepSpeed's kernel
// (part 3) does, rather than storing it: storing would need a fourth fp32 array per element (a
// third more optimizer memory, and one more stream to and from NVMe), recomputing costs one
// division and square root per element. Offloaded to NVMe, the states are streamed twice per step.
//
// The tensors are the layout's (model/layout.h): with tensor parallelism each rank's slice of a
// split tensor is a parameter of its own, as Megatron's optimizer treats it (no sum over the
// tensor group); alignment gaps and padding belong to no tensor and are not updated.
#include <algorithm>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/lamb.h"
#include "zero/zero_engine.h"

namespace zerod {

namespace {
char* at(void* base, int64_t elems, size_t esz) {
  return static_cast<char*>(base) + elems * static_cast<int64_t>(esz);
}
}  // namespace

void ZeroEngine::lamb_step(const OptimStep& s, OptimizerParams p) {
  const int units = layout_.num_units();
  std::vector<int> first(static_cast<size_t>(units) + 1, 0);  // each unit's first tensor index
  for (int u = 0; u < units; ++u)
    first[static_cast<size_t>(u) + 1] =
        first[static_cast<size_t>(u)] + static_cast<int>(layout_.unit(u).tensors.size());
  // fn(k, a, b, off) for every tensor k of unit u that elements [lo, hi) of its shard meet: unit
  // elements [a, b), at `off` in the piece. p.weight_decay is set to the tensor's.
  auto each_tensor = [&](int u, int64_t lo, int64_t hi, auto&& fn) {
    const int64_t sb = partition_.unit(u).begin(owner_rank(u));
    const std::vector<TensorInfo>& ts = layout_.unit(u).tensors;
    for (size_t i = 0; i < ts.size(); ++i) {
      const int64_t a = std::max(ts[i].offset, sb + lo);
      const int64_t b = std::min(ts[i].offset + ts[i].numel, sb + hi);
      if (a >= b) continue;
      p.weight_decay = ts[i].decay ? s.weight_decay : 0.0;
      fn(first[static_cast<size_t>(u)] + static_cast<int>(i), a, b, a - (sb + lo));
    }
  };

  // Pass 1: moments and partial sums of squares.
  std::vector<double> sums(2 * static_cast<size_t>(first.back()), 0.0);
  visit_states(StatesMode::kUpdate, 0, units,
               [&](int u, int64_t lo, int64_t hi, float* pm, float* pa, float* pv) {
                 const int64_t sb = partition_.unit(u).begin(owner_rank(u));
                 char* grads = static_cast<char*>(reducer_->shard(u));
                 if (guard_ && lo == 0) guard_->before_update(u);
                 const bool host = be_.device_memory() && states_on_host(u);
                 const float* g = nullptr;
                 if (host) {  // offloaded states of a GPU run: a host copy of the gradients
                   float* staged = host_stage(hi - lo);
                   be_.cast_from_compute(staged, at(grads, lo, esz_), hi - lo);
                   g = staged;
                 }
                 each_tensor(u, lo, hi, [&](int k, int64_t a, int64_t b, int64_t off) {
                   const Backend::LambSums q =
                       host ? cpu::lamb_moments(pm + off, pa + off, pv + off, g + off, b - a, p)
                            : be_.lamb_moments(pm + off, pa + off, pv + off,
                                               at(grads, a - sb, esz_), b - a, p);
                   sums[2 * static_cast<size_t>(k)] += q.w2;
                   sums[2 * static_cast<size_t>(k) + 1] += q.u2;
                 });
               });
  // Stage 0 ranks hold every tensor whole; the others hold disjoint pieces, of the experts units
  // over the expert-data-parallel group.
  if (opt_.stage >= 1 && expert_groups()) {
    std::vector<double> experts(sums.size(), 0.0);
    for (int u = 0; u < units; ++u) {
      if (!partition_.unit(u).experts) continue;
      for (int k = first[static_cast<size_t>(u)]; k < first[static_cast<size_t>(u) + 1]; ++k)
        for (size_t j = 0; j < 2; ++j) std::swap(experts[2 * k + j], sums[2 * k + j]);
    }
    if (expert_comm_->size() > 1)
      sum_over_ranks(experts.data(), static_cast<int64_t>(experts.size()), expert_comm_);
    if (opt_.comm->size() > 1) sum_over_ranks(sums.data(), static_cast<int64_t>(sums.size()));
    for (size_t i = 0; i < sums.size(); ++i) sums[i] += experts[i];
  } else if (opt_.comm->size() > 1 && opt_.stage >= 1) {
    sum_over_ranks(sums.data(), static_cast<int64_t>(sums.size()));
  }
  const cpu::LambConstants kc = cpu::lamb_constants(p);
  std::vector<float> coeff(static_cast<size_t>(first.back()));
  for (size_t k = 0; k < coeff.size(); ++k)
    coeff[k] = cpu::lamb_coeff(sums[2 * k], sums[2 * k + 1], kc);

  // Pass 2: the step, each tensor scaled by its ratio, and the compute weights.
  visit_states(StatesMode::kUpdate, 0, units,
               [&](int u, int64_t lo, int64_t hi, float* pm, float* pa, float* pv) {
                 // Offloaded states of a GPU run are updated by the CPU; then the compute weights
                 // of the whole piece (gaps and padding included: a staged NVMe shard is written
                 // out whole).
                 const bool host = be_.device_memory() && states_on_host(u);
                 each_tensor(u, lo, hi, [&](int k, int64_t a, int64_t b, int64_t off) {
                   const float c = coeff[static_cast<size_t>(k)];
                   if (host) {
                     cpu::lamb_apply(pm + off, pa + off, pv + off, nullptr, b - a, p, c,
                                     DType::kF32);
                   } else {
                     be_.lamb_apply(pm + off, pa + off, pv + off, nullptr, b - a, p, c);
                   }
                 });
                 if (!fp32_alias())
                   be_.cast_to_compute(at(weight_target(u), lo, esz_), pm, hi - lo);
                 weight_written(u, hi);
               });
}

}  // namespace zerod
