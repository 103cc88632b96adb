// Validation batches: one sequential pass (no shuffle) over a dataset, restartable at 0.
//
// Global micro-batch i covers samples [i * B * W, (i + 1) * B * W) (B = micro_batch, W = world
// size); rank r serves rows [i * B * W + r * B, i * B * W + (r + 1) * B). Only whole global
// micro-batches are served, so every rank runs the same number of forward passes; the last
// num_samples % (B * W) samples are not evaluated.
#pragma once

#include <cstdint>

#include "engine/data/dataset.h"

namespace zerod {

class EvalLoader {
 public:
  // Throws InputError when the dataset has fewer than micro_batch * world_size samples.
  EvalLoader(TokenDataset dataset, int64_t micro_batch, int world_size, int rank);

  // Micro-batches per rank in one full pass (>= 1, the same on every rank).
  int64_t num_micro_batches() const { return num_micro_batches_; }
  int64_t micro_batch() const { return micro_batch_; }
  int64_t seq_len() const { return dataset_.seq_len(); }
  const TokenDataset& dataset() const { return dataset_; }

  // Back to the first micro-batch.
  void restart() { next_ = 0; }

  // Fills inputs (B,T) and targets (B,T) (overwritten; `sample_indices` (B) when not null)
  // with the next micro-batch and returns true; at the end of the pass returns false and
  // leaves the buffers untouched.
  bool next_micro_batch(int32_t* inputs, int32_t* targets, int64_t* sample_indices = nullptr);

 private:
  TokenDataset dataset_;
  int64_t micro_batch_;
  int world_size_;
  int rank_;
  int64_t num_micro_batches_;
  int64_t next_ = 0;
};

}  // namespace zerod
