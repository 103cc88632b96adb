#include "zero/zero_engine.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace zerod {

ZeroEngine::ZeroEngine(const ParamLayout& layout, Backend& backend, const ZeroOptions& options,
                       MemoryTracker* tracker)
    : layout_(layout), be_(backend), opt_(options), partition_(layout, options.world_size) {
  ZD_CHECK(options.world_size == 1 && options.rank == 0 && options.stage == 0,
           "this build's ZeroEngine holds a single rank at stage 0 (got stage {}, world {})",
           options.stage, options.world_size);
  const size_t esz = be_.compute_elem_size();
  for (int u = 0; u < layout_.num_units(); ++u) {
    const UnitPartition& p = partition_.unit(u);
    weights_.push_back(
        be_.allocate(static_cast<size_t>(p.padded) * esz, MemCategory::kWeights, tracker));
    grads_.push_back(
        be_.allocate(static_cast<size_t>(p.padded) * esz, MemCategory::kGradients, tracker));
    master_.push_back(host_alloc(static_cast<size_t>(p.shard) * 4, MemCategory::kMaster, tracker));
    m_.push_back(host_alloc(static_cast<size_t>(p.shard) * 4, MemCategory::kMoments, tracker));
    v_.push_back(host_alloc(static_cast<size_t>(p.shard) * 4, MemCategory::kMoments, tracker));
  }
}

void ZeroEngine::init_weights(uint64_t seed) {
  for (int u = 0; u < layout_.num_units(); ++u) {
    const UnitPartition& p = partition_.unit(u);
    const int64_t begin = p.begin(opt_.rank), valid = p.valid(opt_.rank);
    if (valid > 0) layout_.init_range(u, master(u), begin, begin + valid, seed);
  }
  refresh_weights();
}

void ZeroEngine::refresh_weights() {
  for (int u = 0; u < layout_.num_units(); ++u) {
    const UnitPartition& p = partition_.unit(u);
    be_.cast_to_compute(weights(u), master(u), p.shard);
  }
}

void ZeroEngine::zero_grad() {
  for (auto& g : grads_) be_.memset_zero(g.data(), g.bytes());
}

const void* ZeroEngine::acquire(int unit) {
  return weights(unit);
}
void ZeroEngine::release(int) {}
void* ZeroEngine::grad_buffer(int unit) {
  return grads(unit);
}
void ZeroEngine::unit_done(int) {}

StepResult ZeroEngine::step(const OptimStep& s) {
  StepResult r;
  double sumsq = 0;
  for (int u = 0; u < layout_.num_units(); ++u) {
    sumsq += be_.sum_squares(grads(u), partition_.unit(u).shard);
  }
  if (!std::isfinite(sumsq)) {
    r.overflow = true;
    r.grad_norm = std::numeric_limits<double>::infinity();
    return r;
  }
  r.grad_norm = std::sqrt(sumsq) / s.loss_scale;
  // DeepSpeed / torch clip_grad_norm_: coef = max_norm / (norm + 1e-6) when below 1.
  if (s.max_grad_norm > 0) {
    const double coef = s.max_grad_norm / (r.grad_norm + 1e-6);
    if (coef < 1.0) r.clip_coef = coef;
  }
  ++adam_steps_;
  AdamWParams p;
  p.lr = static_cast<float>(s.lr);
  p.beta1 = static_cast<float>(s.beta1);
  p.beta2 = static_cast<float>(s.beta2);
  p.eps = static_cast<float>(s.eps);
  p.adam_w_mode = s.adam_w_mode;
  p.bias_correction = s.bias_correction;
  p.step = adam_steps_;
  p.grad_scale = static_cast<float>(r.clip_coef / s.loss_scale);
  const size_t esz = be_.compute_elem_size();
  for (int u = 0; u < layout_.num_units(); ++u) {
    const UnitPartition& up = partition_.unit(u);
    const int64_t sb = up.begin(opt_.rank), se = sb + up.shard;
    char* g = static_cast<char*>(grads(u));
    char* w = static_cast<char*>(weights(u));
    for (const DecayRange& d : partition_.decay_ranges(u)) {
      const int64_t lo = std::max(d.begin, sb), hi = std::min(d.end, se);
      if (lo >= hi) continue;
      p.weight_decay = d.decay ? static_cast<float>(s.weight_decay) : 0.0f;
      const int64_t off = lo - sb;
      be_.adamw_update(master(u) + off, exp_avg(u) + off, exp_avg_sq(u) + off,
                       g + static_cast<size_t>(lo) * esz, w + static_cast<size_t>(lo) * esz,
                       hi - lo, p);
    }
  }
  return r;
}

}  // namespace zerod
