// The training and validation datasets of a job, from the `data` section's globs.
//
// With `val` globs, validation is its own dataset (no file may be in both). With no `val`
// globs and val_fraction > 0, validation is the LAST ceil(val_fraction * n) of the n training
// samples and training keeps the rest; the two sample sets are disjoint (the one token where
// the last training window meets the first validation window is shared, as between any two
// consecutive windows). With neither, there is no validation set.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/data/dataset.h"

namespace zerod {

struct TrainValData {
  TokenDataset train;
  std::optional<TokenDataset> val;
  // With train_weights (a blend): the samples of each data.train source, in order (train holds
  // source 0's shards first); empty otherwise.
  std::vector<int64_t> train_source_samples;
};

// InputErrors name the config key: "data.train" without patterns or matches, "data.val",
// "data.val_fraction" outside [0, 1), set together with `val` or with a blend, or leaving no
// training sample. train_weights: empty, or one weight per train glob (a blend, blend.h): each
// glob is a source that must give at least one sample and share no file with another.
TrainValData open_train_val(const std::vector<std::string>& train_globs,
                            const std::vector<std::string>& val_globs, double val_fraction,
                            int64_t seq_len, int64_t vocab_size,
                            const std::vector<double>& train_weights = {});

// The number of samples val_fraction holds out of n: ceil(val_fraction * n), computed so that
// a fraction that is an exact ratio (0.25 of 8) is not rounded up by floating-point error.
int64_t held_out_samples(int64_t n, double val_fraction);

}  // namespace zerod
