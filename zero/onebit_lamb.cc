// OneBitLamb's steps (DeepSpeed's deepspeed/runtime/fp16/onebit/lamb.py; the formulas are in
// zero/onebit.h): the LAMB warm-up, the freeze, the compressed steps with the frozen lamb
// coefficients scaled by the factor from a fresh variance, and the rank-independent state.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "zero/onebit.h"
#include "zero/onebit_bytes.h"

namespace zerod {

namespace {

// Sum of squares of x[0, n) in double.
double sum_squares(const float* x, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

// u = m / (sqrt(v) + eps) (+ wd p): element i of a tensor's update.
inline float lamb_update(float m, float v, float p, float eps, float wd) {
  float u = m / (std::sqrt(v) + eps);
  if (wd > 0.0f) u += wd * p;
  return u;
}

}  // namespace

void OnebitOptimizer::warmup_step(const std::vector<OnebitUnit>& units, const OnebitStep& s) {
  if (kind_ == OnebitKind::kZeroOneAdam) return zeroone_step(units, s);  // its variance steps
  ZD_CHECK(kind_ == OnebitKind::kLamb, "warmup_step is OneBitLamb's or ZeroOneAdam's");
  const float b1 = static_cast<float>(s.beta1), omb1 = static_cast<float>(1.0 - s.beta1);
  const float b2 = static_cast<float>(s.beta2), omb2 = static_cast<float>(1.0 - s.beta2);
  const float eps = static_cast<float>(s.eps);
  for (size_t u = 0; u < units.size(); ++u) {
    const OnebitUnit& x = units[u];
    const auto& tensors = layout_.unit(static_cast<int>(u)).tensors;
    for (size_t t = 0; t < tensors.size(); ++t) {
      const auto [b, e] = live_[u][t];
      const float wd = tensors[t].decay ? static_cast<float>(s.weight_decay) : 0.0f;
      float *p = x.master + b, *m = x.m + b, *v = x.v + b;
      const float* g = x.grad + b;
      const int64_t n = e - b;
      // m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2  (g with the loss scale undone)
      double update_ss = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        const float gi = g[i] * s.grad_scale;
        m[i] = m[i] * b1 + omb1 * gi;
        v[i] = v[i] * b2 + omb2 * gi * gi;
        const float ui = lamb_update(m[i], v[i], p[i], eps, wd);
        update_ss += static_cast<double>(ui) * ui;
      }
      const double weight_norm = std::sqrt(sum_squares(p, n));
      const double update_norm = std::sqrt(update_ss);
      double coeff = 1.0;
      if (weight_norm != 0.0 && update_norm != 0.0)
        coeff = std::clamp(weight_norm / update_norm, cfg_.min_coeff, cfg_.max_coeff);
      LambTensor& lt = lamb_[u][t];
      if (coeff != 1.0)
        lt.coeff_freeze = cfg_.coeff_beta * lt.coeff_freeze + (1.0 - cfg_.coeff_beta) * coeff;
      const float step = static_cast<float>(-s.lr * coeff);
      for (int64_t i = 0; i < n; ++i) p[i] += step * lamb_update(m[i], v[i], p[i], eps, wd);
    }
  }
}

void OnebitOptimizer::lamb_freeze(const std::vector<OnebitUnit>& units) {
  // scaling_t = (mean over every tensor of rms(m)) / rms(m_t): the momenta compressed together
  // get one scale (DeepSpeed computes this once, at the first compressed step).
  // With pipeline stages the mean is over every stage's tensors (summed over the stages' group),
  // each once: a last stage's tied embedding copy is the first stage's tensor again.
  std::vector<std::vector<double>> scales(units.size());
  double sums[2] = {0.0, 0.0};  // (sum of rms, tensors)
  for (size_t u = 0; u < units.size(); ++u) {
    const std::vector<TensorInfo>& tensors = layout_.unit(static_cast<int>(u)).tensors;
    for (size_t t = 0; t < live_[u].size(); ++t) {
      const auto [b, e] = live_[u][t];
      const double rms =
          std::sqrt(sum_squares(units[u].m + b, e - b)) / std::sqrt(static_cast<double>(e - b));
      scales[u].push_back(rms);
      if (!layout_.counted_in_norm(static_cast<int>(u), tensors[t])) continue;
      sums[0] += rms;
      sums[1] += 1.0;
    }
  }
  if (model_parallel_ != nullptr && model_parallel_->size() > 1)
    model_parallel_->all_reduce(sums, 2, CommType::kF64, ReduceOp::kSum);
  const double united = sums[1] > 0 ? sums[0] / sums[1] : 0.0;
  fresh_.clear();
  for (size_t u = 0; u < units.size(); ++u) {
    for (size_t t = 0; t < scales[u].size(); ++t)
      lamb_[u][t].scaling = scales[u][t] > 0.0 ? united / scales[u][t] : 1.0;
    fresh_.emplace_back(units[u].v, units[u].v + units[u].n);
  }
  frozen_ = true;
}

void OnebitOptimizer::lamb_compressed_step(const std::vector<OnebitUnit>& units,
                                           const OnebitStep& s) {
  if (!frozen_) lamb_freeze(units);
  const float b1 = static_cast<float>(s.beta1), omb1 = static_cast<float>(1.0 - s.beta1);
  const float b2 = static_cast<float>(s.beta2), omb2 = static_cast<float>(1.0 - s.beta2);
  const float eps = static_cast<float>(s.eps);
  for (size_t u = 0; u < units.size(); ++u) {
    const OnebitUnit& x = units[u];
    const auto& tensors = layout_.unit(static_cast<int>(u)).tensors;
    last_.assign(x.m, x.m + x.n);
    // m_t = (b1 m_t + (1 - b1) g_local) * scaling_t
    for (size_t t = 0; t < tensors.size(); ++t) {
      const auto [b, e] = live_[u][t];
      const float scaling = static_cast<float>(lamb_[u][t].scaling);
      for (int64_t i = b; i < e; ++i) {
        const float m = x.m[i] * b1 + omb1 * (x.grad[i] * s.grad_scale);
        x.m[i] = m * scaling;
      }
    }
    if (comm_.size() > 1) car_.run(x.m, x.n, worker_[u].data(), server_[u].data());
    for (size_t t = 0; t < tensors.size(); ++t) {
      const auto [b, e] = live_[u][t];
      const float scaling = static_cast<float>(lamb_[u][t].scaling);
      for (int64_t i = b; i < e; ++i) x.m[i] /= scaling;
    }
    mask(static_cast<int>(u), x.m);
    float* fresh = fresh_[u].data();
    for (size_t t = 0; t < tensors.size(); ++t) {
      const auto [b, e] = live_[u][t];
      const float wd = tensors[t].decay ? static_cast<float>(s.weight_decay) : 0.0f;
      // The fresh variance from the reconstructed gradient; the norms and the factor.
      double prelim_ss = 0.0, update_ss = 0.0;
      float factor_f = 0.0f;
      for (int64_t i = b; i < e; ++i) {
        const float r = (x.m[i] - last_[static_cast<size_t>(i)] * b1) / omb1;
        fresh[i] = fresh[i] * b2 + omb2 * r * r;
        const float d = std::sqrt(x.v[i]) + eps;
        const float prelim = x.m[i] / d;
        const float update = wd > 0.0f ? prelim + wd * x.master[i] : prelim;
        prelim_ss += static_cast<double>(prelim) * prelim;
        update_ss += static_cast<double>(update) * update;
        factor_f = std::max(factor_f, d / (std::sqrt(fresh[i]) + eps));
      }
      LambTensor& lt = lamb_[u][t];
      double factor = factor_f;
      if (wd > 0.0f && update_ss > 0.0) {
        const double ratio = std::min(1.0, std::sqrt(prelim_ss) / std::sqrt(update_ss));
        factor = factor * ratio + (1.0 - ratio);
      }
      factor = std::clamp(factor, cfg_.factor_min, cfg_.factor_max);
      factor = std::min(factor, lt.last_factor * (1.0 + cfg_.factor_threshold));
      factor = std::max(factor, lt.last_factor * (1.0 - cfg_.factor_threshold));
      lt.last_factor = factor;
      const float step = static_cast<float>(-s.lr * (lt.coeff_freeze * factor));
      for (int64_t i = b; i < e; ++i) {
        const float d = std::sqrt(x.v[i]) + eps;
        const float prelim = x.m[i] / d;
        const float update = wd > 0.0f ? prelim + wd * x.master[i] : prelim;
        x.master[i] += step * update;
      }
    }
  }
}

std::vector<std::vector<double>> OnebitOptimizer::lamb_coeff_freeze() const {
  std::vector<std::vector<double>> out;
  for (const auto& unit : lamb_) {
    out.emplace_back();
    for (const LambTensor& t : unit) out.back().push_back(t.coeff_freeze);
  }
  return out;
}

namespace {
constexpr char kSharedMagic[8] = {'Z', 'D', '1', 'B', 'S', 'H', '0', '1'};
using onebit_bytes::put;
}  // namespace

// kind, units, frozen; per unit: tensors, then (coeff_freeze, last_factor, scaling) per tensor,
// elements of v_fresh (0 before the freeze) and those floats. Little-endian.
std::string OnebitOptimizer::serialize_shared() const {
  std::string out(kSharedMagic, sizeof(kSharedMagic));
  const int32_t head[3] = {static_cast<int32_t>(kind_), static_cast<int32_t>(lamb_.size()),
                           frozen_ ? 1 : 0};
  put(out, head, sizeof(head));
  for (size_t u = 0; u < lamb_.size(); ++u) {
    const int64_t tensors = static_cast<int64_t>(lamb_[u].size());
    put(out, &tensors, sizeof(tensors));
    for (const LambTensor& t : lamb_[u]) {
      const double d[3] = {t.coeff_freeze, t.last_factor, t.scaling};
      put(out, d, sizeof(d));
    }
    const int64_t n = frozen_ ? static_cast<int64_t>(fresh_[u].size()) : 0;
    put(out, &n, sizeof(n));
    if (n > 0) put(out, fresh_[u].data(), static_cast<size_t>(n) * sizeof(float));
  }
  return out;
}

void OnebitOptimizer::deserialize_shared(const std::string& bytes, const std::string& what) {
  onebit_bytes::Reader in(bytes, what, kSharedMagic);
  auto take = [&](void* p, size_t n) { in.take(p, n); };
  int32_t head[3];
  take(head, sizeof(head));
  if (head[0] != static_cast<int32_t>(kind_) || head[1] != static_cast<int32_t>(lamb_.size()))
    ZD_THROW_INPUT(
        "{}: saved by another 1-bit optimizer kind or model (kind {}, {} units; this "
        "run: kind {}, {} units)",
        what, head[0], head[1], static_cast<int>(kind_), lamb_.size());
  std::vector<std::vector<LambTensor>> lamb(lamb_.size());
  std::vector<std::vector<float>> fresh(lamb_.size());
  for (size_t u = 0; u < lamb_.size(); ++u) {
    int64_t tensors = 0;
    take(&tensors, sizeof(tensors));
    if (tensors != static_cast<int64_t>(lamb_[u].size()))
      ZD_THROW_INPUT("{}: unit {} has {} tensors, expected {}", what, u, tensors, lamb_[u].size());
    for (int64_t t = 0; t < tensors; ++t) {
      double d[3];
      take(d, sizeof(d));
      lamb[u].push_back({d[0], d[1], d[2]});
    }
    int64_t n = 0;
    take(&n, sizeof(n));
    const int64_t want = head[2] != 0 ? part_.unit(static_cast<int>(u)).shard : 0;
    if (n != want)
      ZD_THROW_INPUT("{}: unit {} has {} fresh-variance elements, expected {}", what, u, n, want);
    fresh[u].resize(static_cast<size_t>(n));
    take(fresh[u].data(), static_cast<size_t>(n) * sizeof(float));
  }
  if (in.left() != 0) ZD_THROW_INPUT("{}: {} bytes past the end", what, in.left());
  lamb_ = std::move(lamb);
  fresh_ = head[2] != 0 ? std::move(fresh) : std::vector<std::vector<float>>();
  frozen_ = head[2] != 0;
}

}  // namespace zerod
