// Which transformer layers each pipeline stage holds (DESIGN.md section 8). The embedding is on
// the first stage, the final norm and the head (with the loss) on the last; the layers between
// are split into S = P x V contiguous runs in global stage order (stage s = chunk x P + rank,
// schedule.h), each of at least one layer:
//   uniform     as evenly as possible: the first L mod S stages one layer more (Megatron)
//   parameters  the split whose largest stage (counting the embedding's parameters on the first
//               and the final norm's and head's on the last) is smallest (DeepSpeed's
//               "parameters" method balances the same counts); of those, the one with the
//               smallest sum of squared stage sizes, so the other stages are as even as can be
//   explicit    the layer counts given, one per stage
// Arithmetic only; the config parser checks the same rules on the job file (partition_problem).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zerod::pipeline {

enum class PartitionMethod : unsigned char { kUniform, kParameters, kExplicit };

struct PartitionRequest {
  int layers = 0;  // the model's transformer blocks
  int stages = 1;  // P x V
  PartitionMethod method = PartitionMethod::kUniform;
  std::vector<int> counts;            // kExplicit: layers per stage
  std::vector<int64_t> layer_params;  // kParameters: parameters of each layer (size `layers`)
  int64_t first_params = 0;           // kParameters: the embedding's, on stage 0
  int64_t last_params = 0;            // kParameters: final norm + head, on stage S - 1
};

// "" when the request can be met, else why not, naming the numbers: fewer layers than stages, an
// explicit list of the wrong length, with a zero, or not summing to the layers.
std::string partition_problem(int layers, int stages, PartitionMethod method,
                              const std::vector<int>& counts);

// Layers per stage (size `stages`, summing to `layers`, each >= 1). InputError for
// partition_problem, or layer_params of the wrong size.
std::vector<int> partition_layers(const PartitionRequest& r);

// The first layer of each stage (size stages + 1: the last entry is `layers`).
std::vector<int> stage_first_layers(const std::vector<int>& counts);

}  // namespace zerod::pipeline
