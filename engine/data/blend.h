// Blending training sources in fixed proportions (Megatron's data blend): data.train as
// [{"path": "web/*.bin", "weight": 0.7}, {"path": "code/*.bin", "weight": 0.3}].
//
// The sources' samples are numbered one after another in one TokenDataset (source 0's first).
// The global sample stream (sampler.h) is cut into blocks of kBlendBlock positions; every block
// gives each source the same positions, chosen once by Megatron's greedy rule (position j goes
// to the source furthest behind its weight: argmax_d w_d * (j + 1) - drawn_d, ties to the lower
// d), so source d gets count_d of every kBlendBlock positions: its weight to within one position
// per block. Source d's draws run through its own samples epoch after epoch in a permutation of
// its own (Sampler, from data.seed and d), so a small source repeats while a large one is still
// in its first pass. Like Sampler, the stream depends on global positions only: the same at
// every world size, and a checkpoint's position resumes it exactly (the loader's state carries
// the weights, and DataLoader::restore refuses other ones).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/data/sampler.h"

namespace zerod {

inline constexpr int64_t kBlendBlock = 1 << 16;

class BlendSampler {
 public:
  // source_samples[d] >= 1 samples of source d, weights[d] > 0 (any scale; normalised here).
  // At most 65535 sources.
  BlendSampler(std::vector<int64_t> source_samples, std::vector<double> weights, uint64_t seed,
               bool shuffle);

  int num_sources() const { return static_cast<int>(samples_.size()); }
  int64_t num_samples() const { return total_; }  // of all sources together
  int64_t source_samples(int d) const { return samples_[static_cast<size_t>(d)]; }

  // The source of stream position `position` >= 0.
  int source_at(int64_t position) const;
  // The dataset index (sources numbered one after another) of stream position `position`.
  // Not thread-safe (the per-source Samplers' caches), as Sampler::at.
  int64_t at(int64_t position) const;

  // Positions of every kBlendBlock that source d gets.
  int64_t per_block(int d) const { return per_block_[static_cast<size_t>(d)]; }
  // How many of the positions [0, positions) draw from source d.
  int64_t drawn(int d, int64_t positions) const;

 private:
  std::vector<int64_t> samples_;  // per source
  std::vector<int64_t> first_;    // dataset index of each source's first sample
  std::vector<double> weights_;   // normalised
  int64_t total_ = 0;
  std::vector<uint16_t> block_source_;  // kBlendBlock: the source of each position of a block
  std::vector<uint32_t> block_rank_;    // kBlendBlock: earlier positions of the same source
  std::vector<int64_t> per_block_;
  std::vector<Sampler> samplers_;  // per source
};

// One line per source for the job's log: its path, weight, the share of the stream it gets,
// its samples and how many passes over them `positions` stream positions (the whole run) make.
std::vector<std::string> describe_blend(const BlendSampler& blend,
                                        const std::vector<std::string>& paths,
                                        const std::vector<double>& weights, int64_t positions);

}  // namespace zerod
