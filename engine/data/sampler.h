// The order in which training samples are visited: an endless stream, epoch after epoch, where
// epoch e is a permutation of [0, num_samples) drawn from (seed, e) alone.
//
// Stream positions are global: position p is the p-th sample the whole job consumes, whatever
// the world size, so every rank computes the same stream and takes its own slice of it (see
// loader.h). The permutation is a Fisher-Yates shuffle driven by core/rng.h's counter-based
// Philox generator (never std::shuffle or std::uniform_int_distribution, whose output differs
// between standard libraries), so the order is the same on every machine and build.
#pragma once

#include <cstdint>
#include <vector>

namespace zerod {

class Sampler {
 public:
  // num_samples >= 1. shuffle = false visits 0, 1, ..., n-1 every epoch.
  Sampler(int64_t num_samples, uint64_t seed, bool shuffle = true);

  int64_t num_samples() const { return num_samples_; }
  uint64_t seed() const { return seed_; }
  bool shuffle() const { return shuffle_; }

  // The sample index at global stream position `position` >= 0:
  // permutation(position / num_samples)[position % num_samples]. Random access in any order;
  // the current epoch's permutation is cached, so sequential access costs one shuffle per
  // epoch. Not thread-safe (the cache): give each thread its own Sampler.
  int64_t at(int64_t position) const;

  // The whole permutation of `epoch` (num_samples entries).
  std::vector<int64_t> permutation(int64_t epoch) const;

 private:
  void build(int64_t epoch) const;

  int64_t num_samples_;
  uint64_t seed_;
  bool shuffle_;
  // Cache of one epoch's permutation; 32-bit entries while they fit, to halve the memory of
  // large datasets (10M samples: 40 MB).
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<uint32_t> perm32_;
  mutable std::vector<int64_t> perm64_;
};

}  // namespace zerod
