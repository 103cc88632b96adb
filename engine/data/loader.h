// Training batches for one rank, cut from the global sample stream (sampler.h).
//
// Optimizer step s consumes the global_batch consecutive stream positions
// [p, p + global_batch) with p = s * global_batch (plus any position restored from a
// checkpoint). Rank r of W takes the contiguous slice
// [p + r * global_batch / W, p + (r + 1) * global_batch / W) and serves it as
// global_batch / W / micro_batch micro-batches of micro_batch samples, in stream order.
// So the set of samples in a step depends only on (dataset, seed, global_batch, position),
// never on the world size or the micro-batch size: world 1 x accumulation 4, world 2 x 2 and
// world 4 x 1 train on the same samples, and a checkpoint taken at one world size resumes
// at another. With a blend (blend.h), the stream's positions map to the sources' samples by
// their weights instead of one permutation of the whole dataset.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/data/blend.h"
#include "engine/data/dataset.h"
#include "engine/data/sampler.h"

namespace zerod {

// What a checkpoint stores to resume the sample stream exactly.
struct LoaderState {
  int64_t position = 0;     // global stream position: samples consumed by all ranks (whole steps)
  uint64_t seed = 0;        // the sampler's seed
  int64_t num_samples = 0;  // of the training dataset the position refers to
  std::vector<double> blend_weights;  // the blend's weights; empty without one
};

class DataLoader {
 public:
  // Requires global_batch % world_size == 0 and (global_batch / world_size) % micro_batch == 0
  // (InputError naming the batch keys otherwise) and 0 <= rank < world_size.
  // shuffle = false visits the samples in order, epoch after epoch (data.shuffle).
  // blend_samples: empty, or the samples of each blended source (in dataset order, summing to
  // dataset.num_samples()), with blend_weights one weight > 0 each.
  DataLoader(TokenDataset dataset, uint64_t seed, bool shuffle, int64_t global_batch,
             int64_t micro_batch, int world_size, int rank, std::vector<int64_t> blend_samples = {},
             std::vector<double> blend_weights = {});

  int64_t global_batch() const { return global_batch_; }
  int64_t micro_batch() const { return micro_batch_; }
  int64_t seq_len() const { return dataset_.seq_len(); }
  // Micro-batches this rank serves per step (the gradient accumulation steps).
  int64_t micro_batches_per_step() const { return micro_per_step_; }
  const TokenDataset& dataset() const { return dataset_; }
  // The blend, when the loader has one.
  const BlendSampler* blend() const { return blend_ ? &*blend_ : nullptr; }

  // The next micro-batch of this rank's share of the current step: inputs (B,T) and targets
  // (B,T), overwritten, B = micro_batch, T = seq_len. `sample_indices` (B), when not null,
  // receives the dataset sample index of each row. After the step's last micro-batch the
  // loader is at the next step's boundary.
  void next_micro_batch(int32_t* inputs, int32_t* targets, int64_t* sample_indices = nullptr);

  // True between steps: no micro-batch of the current step has been served yet.
  bool at_step_boundary() const { return micro_index_ == 0; }
  // Micro-batches of the current step already served, 0 .. micro_batches_per_step() - 1.
  int64_t micro_index() const { return micro_index_; }

  // The global stream position of the current step's start: samples consumed by all ranks in
  // completed steps. (Mid-step, the step in progress is not counted.)
  int64_t position() const { return position_; }
  // Moves to `position` (>= 0) at a step boundary; the next micro-batch is the first of the
  // step starting there.
  void set_position(int64_t position);
  // Full passes over the dataset completed by the current step's start.
  int64_t epoch() const { return position_ / dataset_.num_samples(); }

  LoaderState state() const {
    return {position_, sampler_.seed(), dataset_.num_samples(), blend_weights_};
  }
  // set_position(state.position) after checking that the state belongs to this stream: a
  // different seed, number of samples (the data changed since the checkpoint) or blend (other
  // weights, up to a common factor) would resume on other samples, so it is an InputError
  // saying which differs.
  void restore(const LoaderState& state);

 private:
  TokenDataset dataset_;
  Sampler sampler_;
  std::optional<BlendSampler> blend_;
  std::vector<double> blend_weights_;  // as given
  int64_t global_batch_;
  int64_t micro_batch_;
  int world_size_;
  int rank_;
  int64_t micro_per_step_;
  int64_t position_ = 0;
  int64_t micro_index_ = 0;
};

}  // namespace zerod
