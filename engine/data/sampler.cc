#include "engine/data/sampler.h"

#include <numeric>
#include <utility>

#include "core/error.h"
#include "core/rng.h"

namespace zerod {

namespace {

// Philox stream of epoch e's shuffle: a fixed tag keeps these numbers apart from other users of
// the same seed value (weight initialisation uses small stream numbers).
constexpr uint64_t kSamplerStreamTag = 0x53414d504c455200ull;  // "SAMPLER\0"

template <typename Index>
void fisher_yates(std::vector<Index>& perm, int64_t n, uint64_t seed, int64_t epoch) {
  perm.resize(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), Index{0});
  Rng rng(seed, kSamplerStreamTag ^ static_cast<uint64_t>(epoch));
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.uniform(static_cast<uint64_t>(i) + 1));
    std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(j)]);
  }
}

}  // namespace

Sampler::Sampler(int64_t num_samples, uint64_t seed, bool shuffle)
    : num_samples_(num_samples), seed_(seed), shuffle_(shuffle) {
  ZD_CHECK(num_samples >= 1, "Sampler needs at least one sample, got {}", num_samples);
}

void Sampler::build(int64_t epoch) const {
  if (num_samples_ <= static_cast<int64_t>(UINT32_MAX)) {
    perm64_.clear();
    fisher_yates(perm32_, num_samples_, seed_, epoch);
  } else {
    perm32_.clear();
    fisher_yates(perm64_, num_samples_, seed_, epoch);
  }
  cached_epoch_ = epoch;
}

int64_t Sampler::at(int64_t position) const {
  ZD_CHECK(position >= 0, "stream position {} must be >= 0", position);
  const int64_t epoch = position / num_samples_;
  const int64_t offset = position % num_samples_;
  if (!shuffle_) return offset;
  if (epoch != cached_epoch_) build(epoch);
  return perm32_.empty() ? perm64_[static_cast<size_t>(offset)]
                         : static_cast<int64_t>(perm32_[static_cast<size_t>(offset)]);
}

std::vector<int64_t> Sampler::permutation(int64_t epoch) const {
  ZD_CHECK(epoch >= 0, "epoch {} must be >= 0", epoch);
  std::vector<int64_t> out(static_cast<size_t>(num_samples_));
  for (int64_t i = 0; i < num_samples_; ++i)
    out[static_cast<size_t>(i)] = at(epoch * num_samples_ + i);
  return out;
}

}  // namespace zerod
