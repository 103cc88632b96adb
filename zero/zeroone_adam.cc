// ZeroOneAdam's steps (DeepSpeed's 0/1 Adam, deepspeed/runtime/fp16/onebit/zoadam.py; the
// formulas are in zero/onebit.h): the variance phase (variance steps on all-reduced gradients,
// momentum from compressed gradients in between), the frozen phase (local steps, the accumulated
// update synchronised through the compressed all-reduce), the interval policies, and the state a
// rank keeps for a bitwise resume.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "zero/onebit.h"
#include "zero/onebit_bytes.h"

namespace zerod {

void OnebitOptimizer::zeroone_step(const std::vector<OnebitUnit>& units, const OnebitStep& s) {
  const int64_t c = s.step + 1;  // DeepSpeed's state['step'] (its first call only initialises)
  const bool frozen = s.step > cfg_.var_freeze_step;
  if (frozen && !zo_.errors_zeroed) {
    // DeepSpeed's reinitial_error_buffer: the errors were the gradients'; now the momentum's.
    for (auto& w : worker_) std::fill(w.begin(), w.end(), 0.0f);
    for (auto& e : server_) std::fill(e.begin(), e.end(), 0.0f);
    zo_.errors_zeroed = true;
  }
  const bool var_step = !frozen && c % zo_.var_interval == 0;
  const bool sync = frozen && c % zo_.local_interval == 0;
  const float b1 = static_cast<float>(s.beta1), omb1 = static_cast<float>(1.0 - s.beta1);
  const float b2 = static_cast<float>(s.beta2), omb2 = static_cast<float>(1.0 - s.beta2);
  const float eps = static_cast<float>(s.eps), neg_lr = static_cast<float>(-s.lr);
  const bool distributed = comm_.size() > 1;
  if (frozen) zo_.lrs += s.lr;
  for (size_t u = 0; u < units.size(); ++u) {
    const OnebitUnit& x = units[u];
    float* acc = frozen ? acc_[u].data() : nullptr;
    if (var_step) {
      // v = b2 v + (1 - b2) g^2;  m = b1 m + (1 - b1) g  (g all-reduced)
      for (int64_t i = 0; i < x.n; ++i) {
        const float g = x.grad[i] * s.grad_scale;
        x.v[i] = x.v[i] * b2 + omb2 * g * g;
        x.m[i] = x.m[i] * b1 + omb1 * g;
      }
    } else if (!frozen) {
      // m = b1 m + (1 - b1) mask(compressed_allreduce(g_local))
      sent_.resize(static_cast<size_t>(x.n));
      for (int64_t i = 0; i < x.n; ++i) sent_[static_cast<size_t>(i)] = x.grad[i] * s.grad_scale;
      if (distributed) car_.run(sent_.data(), x.n, worker_[u].data(), server_[u].data());
      mask(static_cast<int>(u), sent_.data());
      for (int64_t i = 0; i < x.n; ++i) x.m[i] = x.m[i] * b1 + omb1 * sent_[static_cast<size_t>(i)];
    } else {
      // m = b1 m + (1 - b1) g_local
      for (int64_t i = 0; i < x.n; ++i) x.m[i] = x.m[i] * b1 + omb1 * (x.grad[i] * s.grad_scale);
    }
    // u = m / (sqrt(v) + eps) (+ wd p);  p -= lr u  (frozen: acc -= lr u)
    for (const DecayRange& d : part_.decay_ranges(static_cast<int>(u))) {
      const float wd = d.decay ? static_cast<float>(s.weight_decay) : 0.0f;
      for (int64_t i = d.begin; i < d.end; ++i) {
        float update = x.m[i] / (std::sqrt(x.v[i]) + eps);
        if (wd > 0.0f) update += wd * x.master[i];
        const float step = neg_lr * update;
        x.master[i] += step;
        if (acc != nullptr) acc[i] += step;
      }
    }
    if (!sync) continue;
    // The synchronisation: undo the local steps, average their momentum-scale sum over the
    // ranks (compressed), and apply it once.
    for (int64_t i = 0; i < x.n; ++i) {
      x.master[i] += -acc[i];
      acc[i] *= std::sqrt(x.v[i]) + eps;
    }
    if (distributed) car_.run(acc, x.n, worker_[u].data(), server_[u].data());
    mask(static_cast<int>(u), acc);
    const float lrs = static_cast<float>(zo_.lrs);
    for (int64_t i = 0; i < x.n; ++i) {
      x.m[i] = -(acc[i] / lrs);
      x.master[i] += acc[i] / (std::sqrt(x.v[i]) + eps);
      acc[i] = 0.0f;
    }
  }
  if (sync) zo_.lrs = 0.0;
  // The interval policies (DeepSpeed updates them after the step).
  if (!frozen) {
    if (var_step && ++zo_.var_counter == cfg_.var_update_scaler) {
      zo_.var_counter = 0;
      zo_.var_interval *= 2;
    }
  } else if (++zo_.local_counter == cfg_.local_step_scaler) {
    zo_.local_counter = 0;
    zo_.local_interval = std::min(cfg_.local_step_clipper, zo_.local_interval * 2);
  }
}

void OnebitOptimizer::capture_rank_states(int u, int64_t lo, int64_t hi, const float* master,
                                          const float* m) {
  if (own_.size() != acc_.size()) {
    own_.clear();
    for (const auto& a : acc_) own_.emplace_back(2 * a.size(), 0.0f);
  }
  float* dst = own_[static_cast<size_t>(u)].data();
  const int64_t n = static_cast<int64_t>(acc_[static_cast<size_t>(u)].size());
  std::copy(master, master + (hi - lo), dst + lo);
  std::copy(m, m + (hi - lo), dst + n + lo);
}

void OnebitOptimizer::restore_rank_states(int u, int64_t lo, int64_t hi, float* master,
                                          float* m) const {
  const float* src = own_[static_cast<size_t>(u)].data();
  const int64_t n = static_cast<int64_t>(acc_[static_cast<size_t>(u)].size());
  std::copy(src + lo, src + hi, master);
  std::copy(src + n + lo, src + n + hi, m);
}

namespace {
using onebit_bytes::put;
}  // namespace

// After the errors: the counters, lrs, errors_zeroed, each unit's accumulator, then whether the
// rank is between synchronisations (keeps_rank_states) and if so each unit's weights and
// momentum as captured (this rank's: local steps make them differ from rank 0's in the shards).
void OnebitOptimizer::zeroone_serialize(std::string& out) const {
  const int64_t counters[5] = {zo_.var_interval, zo_.var_counter, zo_.local_interval,
                               zo_.local_counter, zo_.errors_zeroed ? 1 : 0};
  put(out, counters, sizeof(counters));
  put(out, &zo_.lrs, sizeof(zo_.lrs));
  for (const auto& a : acc_) put(out, a.data(), a.size() * sizeof(float));
  const int64_t own = keeps_rank_states() ? 1 : 0;
  put(out, &own, sizeof(own));
  if (own == 0) return;
  ZD_CHECK(own_.size() == acc_.size(), "ZeroOneAdam: the rank's states were not captured");
  for (const auto& o : own_) put(out, o.data(), o.size() * sizeof(float));
}

void OnebitOptimizer::zeroone_deserialize(onebit_bytes::Reader& in, const std::string& what) {
  ZeroOneCounters zo;
  int64_t counters[5];
  in.take(counters, sizeof(counters));
  in.take(&zo.lrs, sizeof(zo.lrs));
  zo.var_interval = counters[0];
  zo.var_counter = counters[1];
  zo.local_interval = counters[2];
  zo.local_counter = counters[3];
  zo.errors_zeroed = counters[4] != 0;
  if (zo.var_interval < 1 || zo.local_interval < 1)
    ZD_THROW_INPUT("{}: ZeroOneAdam intervals {} / {} (must be >= 1)", what, zo.var_interval,
                   zo.local_interval);
  std::vector<std::vector<float>> acc(acc_.size()), own;
  for (size_t u = 0; u < acc_.size(); ++u) {
    acc[u].resize(acc_[u].size());
    in.take(acc[u].data(), acc[u].size() * sizeof(float));
  }
  int64_t has_own = 0;
  in.take(&has_own, sizeof(has_own));
  if (has_own != 0) {
    for (const auto& a : acc_) {
      own.emplace_back(2 * a.size());
      in.take(own.back().data(), own.back().size() * sizeof(float));
    }
  }
  if (in.left() != 0) ZD_THROW_INPUT("{}: {} bytes past the end", what, in.left());
  zo_ = zo;
  acc_ = std::move(acc);
  own_ = std::move(own);
}

}  // namespace zerod
