#include "engine/data/eval_loader.h"

#include <utility>

#include "core/error.h"

namespace zerod {

EvalLoader::EvalLoader(TokenDataset dataset, int64_t micro_batch, int world_size, int rank)
    : dataset_(std::move(dataset)),
      micro_batch_(micro_batch),
      world_size_(world_size),
      rank_(rank) {
  ZD_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "rank {} of world size {}", rank,
           world_size);
  ZD_CHECK(micro_batch >= 1, "micro_batch {} must be >= 1", micro_batch);
  const int64_t global_micro = micro_batch * world_size;
  num_micro_batches_ = dataset_.num_samples() / global_micro;
  if (num_micro_batches_ == 0) {
    ZD_THROW_INPUT(
        "{}: {} validation samples (seq_len {}) are fewer than one micro-batch on every rank "
        "(train_micro_batch_size_per_gpu {} x world size {} = {}); expected more validation "
        "data",
        dataset_.what(), dataset_.num_samples(), dataset_.seq_len(), micro_batch, world_size,
        global_micro);
  }
}

bool EvalLoader::next_micro_batch(int32_t* inputs, int32_t* targets, int64_t* sample_indices) {
  if (next_ >= num_micro_batches_) return false;
  const int64_t T = dataset_.seq_len();
  const int64_t first = (next_ * world_size_ + rank_) * micro_batch_;
  for (int64_t b = 0; b < micro_batch_; ++b) {
    dataset_.read_sample(first + b, inputs + b * T, targets + b * T);
    if (sample_indices != nullptr) sample_indices[b] = first + b;
  }
  ++next_;
  return true;
}

}  // namespace zerod
