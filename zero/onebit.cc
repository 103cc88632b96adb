#include "zero/onebit.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "zero/onebit_bytes.h"

namespace zerod {

OnebitKind onebit_kind(const std::string& type) {
  if (type == "OneBitAdam") return OnebitKind::kAdam;
  if (type == "ZeroOneAdam") return OnebitKind::kZeroOneAdam;
  if (type == "OneBitLamb") return OnebitKind::kLamb;
  return OnebitKind::kNone;
}

OnebitOptimizer::OnebitOptimizer(OnebitKind kind, const OnebitConfig& cfg,
                                 const ParamLayout& layout, const Partition& part,
                                 Communicator& comm, Communicator* model_parallel)
    : kind_(kind),
      cfg_(cfg),
      layout_(layout),
      part_(part),
      comm_(comm),
      model_parallel_(model_parallel),
      car_(comm) {
  ZD_CHECK(kind_ != OnebitKind::kNone, "no 1-bit optimizer kind");
  for (int u = 0; u < layout_.num_units(); ++u) {
    const int64_t n = part_.unit(u).shard;
    std::vector<std::pair<int64_t, int64_t>> live;
    for (const TensorInfo& t : layout_.unit(u).tensors) {
      int64_t count = t.numel;
      if (t.real_rows >= 0 && !t.shape.empty() && t.shape[0] > 0)
        count = t.numel / t.shape[0] * t.real_rows;  // the padded vocabulary rows are not live
      live.emplace_back(t.offset, t.offset + count);
    }
    live_.push_back(std::move(live));
    const int64_t padded = car_.padded_elems(n);
    worker_.emplace_back(static_cast<size_t>(padded), 0.0f);
    server_.emplace_back(static_cast<size_t>(padded / comm_.size()), 0.0f);
    if (kind_ == OnebitKind::kLamb) lamb_.emplace_back(layout_.unit(u).tensors.size());
    if (kind_ == OnebitKind::kZeroOneAdam) acc_.emplace_back(static_cast<size_t>(n), 0.0f);
  }
}

bool OnebitOptimizer::reduces_gradients(int64_t step) const {
  // ZeroOneAdam: the variance steps (DeepSpeed's counter is step + 1; zero/onebit.h).
  if (kind_ == OnebitKind::kZeroOneAdam)
    return step <= cfg_.var_freeze_step && (step + 1) % zo_.var_interval == 0;
  return step <= cfg_.freeze_step;
}

void OnebitOptimizer::mask(int u, float* m) const {
  int64_t at = 0;
  for (const auto& [b, e] : live_[static_cast<size_t>(u)]) {
    std::fill(m + at, m + b, 0.0f);
    at = e;
  }
  std::fill(m + at, m + part_.unit(u).shard, 0.0f);
}

void OnebitOptimizer::compressed_step(const std::vector<OnebitUnit>& units, const OnebitStep& s) {
  if (kind_ == OnebitKind::kLamb) {
    lamb_compressed_step(units, s);
  } else if (kind_ == OnebitKind::kZeroOneAdam) {
    zeroone_step(units, s);
  } else {
    adam_compressed_step(units, s);
  }
}

void OnebitOptimizer::adam_compressed_step(const std::vector<OnebitUnit>& units,
                                           const OnebitStep& s) {
  const float b1 = static_cast<float>(s.beta1), omb1 = static_cast<float>(1.0 - s.beta1);
  const float eps = static_cast<float>(s.eps), neg_lr = static_cast<float>(-s.lr);
  for (int u = 0; u < static_cast<int>(units.size()); ++u) {
    const OnebitUnit& x = units[static_cast<size_t>(u)];
    // DeepSpeed: exp_avg.mul_(beta1).add_(1 - beta1, grad) with the local gradient.
    for (int64_t i = 0; i < x.n; ++i) {
      const float g = x.grad[i] * s.grad_scale;
      const float t = x.m[i] * b1;
      x.m[i] = t + omb1 * g;
    }
    if (comm_.size() > 1)
      car_.run(x.m, x.n, worker_[static_cast<size_t>(u)].data(),
               server_[static_cast<size_t>(u)].data());
    mask(u, x.m);
    // update = m / (sqrt(v) + eps) (+ wd p on decayed tensors); p += -lr * update
    for (const DecayRange& d : part_.decay_ranges(u)) {
      const float wd = d.decay ? static_cast<float>(s.weight_decay) : 0.0f;
      for (int64_t i = d.begin; i < d.end; ++i) {
        float update = x.m[i] / (std::sqrt(x.v[i]) + eps);
        if (wd > 0.0f) update += wd * x.master[i];
        x.master[i] += neg_lr * update;
      }
    }
  }
}

namespace {
constexpr char kMagic[8] = {'Z', 'D', '1', 'B', 'I', 'T', '0', '1'};
using onebit_bytes::put;
}  // namespace

std::string OnebitOptimizer::serialize(int64_t step) const {
  std::string out(kMagic, sizeof(kMagic));
  const int32_t head[4] = {static_cast<int32_t>(kind_), comm_.size(), comm_.rank(),
                           static_cast<int32_t>(worker_.size())};
  put(out, head, sizeof(head));
  put(out, &step, sizeof(step));
  for (size_t u = 0; u < worker_.size(); ++u) {
    const int64_t sizes[2] = {static_cast<int64_t>(worker_[u].size()),
                              static_cast<int64_t>(server_[u].size())};
    put(out, sizes, sizeof(sizes));
    put(out, worker_[u].data(), worker_[u].size() * sizeof(float));
    put(out, server_[u].data(), server_[u].size() * sizeof(float));
  }
  if (kind_ == OnebitKind::kZeroOneAdam) zeroone_serialize(out);
  return out;
}

void OnebitOptimizer::deserialize(const std::string& bytes, const std::string& what) {
  onebit_bytes::Reader in(bytes, what, kMagic);
  auto take = [&](void* p, size_t n) { in.take(p, n); };
  int32_t head[4];
  int64_t step = 0;
  take(head, sizeof(head));
  take(&step, sizeof(step));
  if (head[0] != static_cast<int32_t>(kind_) || head[1] != comm_.size() ||
      head[3] != static_cast<int32_t>(worker_.size())) {
    ZD_THROW_INPUT(
        "{}: saved by another 1-bit optimizer kind, world size or model (kind {}, "
        "world {}, {} units; this run: kind {}, world {}, {} units)",
        what, head[0], head[1], head[3], static_cast<int>(kind_), comm_.size(), worker_.size());
  }
  for (size_t u = 0; u < worker_.size(); ++u) {
    int64_t sizes[2];
    take(sizes, sizeof(sizes));
    if (sizes[0] != static_cast<int64_t>(worker_[u].size()) ||
        sizes[1] != static_cast<int64_t>(server_[u].size()))
      ZD_THROW_INPUT("{}: unit {} has {} + {} error elements, expected {} + {}", what, u, sizes[0],
                     sizes[1], worker_[u].size(), server_[u].size());
    take(worker_[u].data(), worker_[u].size() * sizeof(float));
    take(server_[u].data(), server_[u].size() * sizeof(float));
  }
  if (kind_ == OnebitKind::kZeroOneAdam) zeroone_deserialize(in, what);
}

}  // namespace zerod
