#include "engine/data/loader.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <utility>

#include "core/error.h"

namespace zerod {

namespace {

// The same blend: as many sources with proportional weights (the sampler normalises them).
bool same_blend(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  double sa = 0, sb = 0;
  for (double w : a) sa += w;
  for (double w : b) sb += w;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::abs(a[i] / sa - b[i] / sb) > 1e-9) return false;
  return true;
}

}  // namespace

DataLoader::DataLoader(TokenDataset dataset, uint64_t seed, bool shuffle, int64_t global_batch,
                       int64_t micro_batch, int world_size, int rank,
                       std::vector<int64_t> blend_samples, std::vector<double> blend_weights)
    : dataset_(std::move(dataset)),
      sampler_(dataset_.num_samples(), seed, shuffle),
      global_batch_(global_batch),
      micro_batch_(micro_batch),
      world_size_(world_size),
      rank_(rank) {
  ZD_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "rank {} of world size {}", rank,
           world_size);
  ZD_CHECK_INPUT(global_batch >= 1 && micro_batch >= 1,
                 "train_batch_size {} and train_micro_batch_size_per_gpu {} must be >= 1",
                 global_batch, micro_batch);
  ZD_CHECK_INPUT(global_batch % world_size == 0,
                 "train_batch_size {} is not divisible by the world size {}", global_batch,
                 world_size);
  const int64_t per_rank = global_batch / world_size;
  ZD_CHECK_INPUT(per_rank % micro_batch == 0,
                 "train_batch_size {} / world size {} = {} samples per rank is not a multiple of "
                 "train_micro_batch_size_per_gpu {}",
                 global_batch, world_size, per_rank, micro_batch);
  micro_per_step_ = per_rank / micro_batch;
  if (!blend_samples.empty()) {
    int64_t total = 0;
    for (int64_t n : blend_samples) total += n;
    ZD_CHECK(total == dataset_.num_samples(), "blend of {} samples over a dataset of {}", total,
             dataset_.num_samples());
    blend_weights_ = blend_weights;
    blend_.emplace(std::move(blend_samples), std::move(blend_weights), seed, shuffle);
  }
}

void DataLoader::next_micro_batch(int32_t* inputs, int32_t* targets, int64_t* sample_indices) {
  const int64_t T = dataset_.seq_len();
  const int64_t first =
      position_ + rank_ * (global_batch_ / world_size_) + micro_index_ * micro_batch_;
  for (int64_t b = 0; b < micro_batch_; ++b) {
    const int64_t sample = blend_ ? blend_->at(first + b) : sampler_.at(first + b);
    dataset_.read_sample(sample, inputs + b * T, targets + b * T);
    if (sample_indices != nullptr) sample_indices[b] = sample;
  }
  if (++micro_index_ == micro_per_step_) {
    micro_index_ = 0;
    position_ += global_batch_;
  }
}

void DataLoader::set_position(int64_t position) {
  ZD_CHECK(position >= 0, "loader position {} must be >= 0", position);
  position_ = position;
  micro_index_ = 0;
}

void DataLoader::restore(const LoaderState& state) {
  if (state.seed != sampler_.seed()) {
    ZD_THROW_INPUT(
        "data loader state: saved with data.seed {}, the job now has data.seed {}; expected the "
        "same seed to resume the same sample order",
        state.seed, sampler_.seed());
  }
  if (state.num_samples != dataset_.num_samples()) {
    ZD_THROW_INPUT(
        "data loader state: saved over {} training samples, {} now has {} (seq_len {}); the "
        "data or seq_len changed since the checkpoint, expected the same to resume the same "
        "sample order",
        state.num_samples, dataset_.what(), dataset_.num_samples(), dataset_.seq_len());
  }
  if (!same_blend(state.blend_weights, blend_weights_)) {
    ZD_THROW_INPUT(
        "data loader state: saved with data.train blend weights [{}], the job now has [{}]; "
        "expected the same blend to resume the same sample stream",
        fmt::join(state.blend_weights, ", "), fmt::join(blend_weights_, ", "));
  }
  if (state.position < 0)
    ZD_THROW_INPUT("data loader state: position {} is negative, expected >= 0", state.position);
  set_position(state.position);
}

}  // namespace zerod
