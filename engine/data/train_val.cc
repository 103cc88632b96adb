#include "engine/data/train_val.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <system_error>
#include <utility>

#include <fmt/format.h>

#include "core/error.h"
#include "engine/data/glob.h"

namespace zerod {

namespace {
std::string real_path(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::weakly_canonical(path, ec);
  return ec ? path : p.string();
}
}  // namespace

int64_t held_out_samples(int64_t n, double val_fraction) {
  if (n <= 0 || val_fraction <= 0.0) return 0;
  const double exact = val_fraction * static_cast<double>(n);
  // Forgive the last bits of rounding error (0.7 * 10 = 7.000000000000001).
  const int64_t held = static_cast<int64_t>(std::ceil(exact - 1e-9 * std::max(1.0, exact)));
  return std::clamp<int64_t>(held, 1, n);
}

TrainValData open_train_val(const std::vector<std::string>& train_globs,
                            const std::vector<std::string>& val_globs, double val_fraction,
                            int64_t seq_len, int64_t vocab_size,
                            const std::vector<double>& train_weights) {
  if (train_globs.empty()) {
    ZD_THROW_INPUT(
        "data.train: no shard pattern given; expected a glob of llm.c .bin token shards, e.g. "
        "\"data/train_*.bin\"");
  }
  if (!(val_fraction >= 0.0 && val_fraction < 1.0))
    ZD_THROW_INPUT("data.val_fraction: found {}, expected a number in [0, 1)", val_fraction);
  if (!val_globs.empty() && val_fraction > 0.0) {
    ZD_THROW_INPUT(
        "data.val_fraction: found {}, but data.val is set too; val_fraction only carves a "
        "validation split out of data.train when data.val is empty: set one of them",
        val_fraction);
  }

  ZD_CHECK(train_weights.empty() || train_weights.size() == train_globs.size(),
           "{} weights for {} data.train globs", train_weights.size(), train_globs.size());
  if (!train_weights.empty() && val_fraction > 0.0) {
    ZD_THROW_INPUT(
        "data.val_fraction: found {}, but data.train is a blend (weighted paths); "
        "give the validation shards as data.val",
        val_fraction);
  }
  std::vector<std::string> train_files;
  std::vector<size_t> source_end;  // with a blend: one past each source's last file
  if (train_weights.empty()) {
    train_files = expand_globs(train_globs, "data.train");
  } else {
    std::map<std::string, size_t> seen;  // real path -> its source
    for (size_t i = 0; i < train_globs.size(); ++i) {
      const std::string key = fmt::format("data.train[{}].path", i);
      for (const std::string& f : expand_globs({train_globs[i]}, key)) {
        const auto [it, fresh] = seen.emplace(real_path(f), i);
        if (!fresh) {
          ZD_THROW_INPUT(
              "{}: file '{}' also matches data.train[{}].path; expected the blended "
              "sources to share no shard",
              key, f, it->second);
        }
        train_files.push_back(f);
      }
      source_end.push_back(train_files.size());
    }
  }
  TokenDataset train(train_files, seq_len, vocab_size, "data.train");
  std::vector<int64_t> source_samples;
  for (size_t i = 0; i < source_end.size(); ++i) {
    const size_t begin = i == 0 ? 0 : source_end[i - 1];
    const int64_t n = train.shard_first_sample(static_cast<int64_t>(source_end[i])) -
                      train.shard_first_sample(static_cast<int64_t>(begin));
    if (n == 0) {
      ZD_THROW_INPUT(
          "data.train[{}].path '{}': its {} shard(s) give no sample of seq_len + 1 = "
          "{} tokens; expected longer shards or a smaller seq_len",
          i, train_globs[i], source_end[i] - begin, seq_len + 1);
    }
    source_samples.push_back(n);
  }

  if (!val_globs.empty()) {
    const std::vector<std::string> val_files = expand_globs(val_globs, "data.val");
    // Compare real paths, so "./data/a.bin" and "data/a.bin" are the same file.
    std::vector<std::string> train_real;
    for (const std::string& f : train_files) train_real.push_back(real_path(f));
    std::sort(train_real.begin(), train_real.end());
    for (const std::string& f : val_files) {
      if (std::binary_search(train_real.begin(), train_real.end(), real_path(f))) {
        ZD_THROW_INPUT(
            "data.val: file '{}' also matches data.train; expected validation shards disjoint "
            "from the training shards",
            f);
      }
    }
    TokenDataset val(val_files, seq_len, vocab_size, "data.val");
    return {std::move(train), std::move(val), std::move(source_samples)};
  }
  if (val_fraction == 0.0) return {std::move(train), std::nullopt, std::move(source_samples)};

  const int64_t n = train.num_samples();
  const int64_t held = held_out_samples(n, val_fraction);
  if (held >= n) {
    ZD_THROW_INPUT(
        "data.val_fraction: {} of data.train's {} samples (seq_len {}) holds out {} and leaves "
        "no training sample; expected a smaller fraction or more data",
        val_fraction, n, seq_len, held);
  }
  TokenDataset val = train.subset(n - held, n, "data.val (val_fraction of data.train)");
  TokenDataset kept = train.subset(0, n - held, "data.train");
  return {std::move(kept), std::move(val)};
}

}  // namespace zerod
