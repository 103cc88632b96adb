#include "engine/data/blend.h"

#include <fmt/format.h>

#include <numeric>

#include "core/error.h"

namespace zerod {

namespace {

// Source d's shuffling seed: data.seed mixed with d (splitmix64's constants), so sources with
// equal sizes do not visit their samples in the same order.
uint64_t source_seed(uint64_t seed, int d) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(d + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

BlendSampler::BlendSampler(std::vector<int64_t> source_samples, std::vector<double> weights,
                           uint64_t seed, bool shuffle)
    : samples_(std::move(source_samples)) {
  const size_t n = samples_.size();
  ZD_CHECK(n >= 1 && n <= 65535 && weights.size() == n, "blend of {} sources with {} weights", n,
           weights.size());
  double sum = 0.0;
  for (size_t d = 0; d < n; ++d) {
    ZD_CHECK(samples_[d] >= 1, "blend source {} has {} samples", d, samples_[d]);
    ZD_CHECK(weights[d] > 0.0, "blend source {} has weight {}", d, weights[d]);
    sum += weights[d];
  }
  for (size_t d = 0; d < n; ++d) {
    weights_.push_back(weights[d] / sum);
    first_.push_back(total_);
    total_ += samples_[d];
    samplers_.emplace_back(samples_[d], source_seed(seed, static_cast<int>(d)), shuffle);
  }
  block_source_.resize(kBlendBlock);
  block_rank_.resize(kBlendBlock);
  per_block_.assign(n, 0);
  for (int64_t j = 0; j < kBlendBlock; ++j) {
    size_t best = 0;
    double best_error = -1e300;
    for (size_t d = 0; d < n; ++d) {
      const double error =
          weights_[d] * static_cast<double>(j + 1) - static_cast<double>(per_block_[d]);
      if (error > best_error) {
        best_error = error;
        best = d;
      }
    }
    block_source_[static_cast<size_t>(j)] = static_cast<uint16_t>(best);
    block_rank_[static_cast<size_t>(j)] = static_cast<uint32_t>(per_block_[best]++);
  }
}

int BlendSampler::source_at(int64_t position) const {
  ZD_CHECK(position >= 0, "stream position {} must be >= 0", position);
  return block_source_[static_cast<size_t>(position % kBlendBlock)];
}

int64_t BlendSampler::at(int64_t position) const {
  ZD_CHECK(position >= 0, "stream position {} must be >= 0", position);
  const size_t j = static_cast<size_t>(position % kBlendBlock);
  const int d = block_source_[j];
  const int64_t draw = position / kBlendBlock * per_block_[static_cast<size_t>(d)] + block_rank_[j];
  return first_[static_cast<size_t>(d)] + samplers_[static_cast<size_t>(d)].at(draw);
}

int64_t BlendSampler::drawn(int d, int64_t positions) const {
  ZD_CHECK(d >= 0 && d < num_sources() && positions >= 0, "drawn({}, {})", d, positions);
  const int64_t whole = positions / kBlendBlock;
  const int64_t rest = positions % kBlendBlock;
  int64_t count = whole * per_block_[static_cast<size_t>(d)];
  for (int64_t j = 0; j < rest; ++j) count += block_source_[static_cast<size_t>(j)] == d;
  return count;
}

std::vector<std::string> describe_blend(const BlendSampler& blend,
                                        const std::vector<std::string>& paths,
                                        const std::vector<double>& weights, int64_t positions) {
  const double sum = std::accumulate(weights.begin(), weights.end(), 0.0);
  std::vector<std::string> lines;
  for (int d = 0; d < blend.num_sources(); ++d) {
    const int64_t drawn = blend.drawn(d, positions);
    lines.push_back(fmt::format(
        "'{}': weight {:g} ({:.2f}%) -> {:.2f}% of the stream; this run draws {} samples, {:.2f} "
        "passes over its {}",
        paths[static_cast<size_t>(d)], weights[static_cast<size_t>(d)],
        100.0 * weights[static_cast<size_t>(d)] / sum,
        100.0 * static_cast<double>(blend.per_block(d)) / static_cast<double>(kBlendBlock), drawn,
        static_cast<double>(drawn) / static_cast<double>(blend.source_samples(d)),
        blend.source_samples(d)));
  }
  return lines;
}

}  // namespace zerod
