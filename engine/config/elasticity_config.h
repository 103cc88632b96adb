// DeepSpeed's "elasticity" section (deepspeed/elasticity/config.py and constants.py): the
// batch sizes a job keeps across world sizes. With enabled, the global batch is computed from
// these keys (engine/config/elasticity.h), and train_batch_size / micro-batch / accumulation
// follow from it for the world size the job runs at. Part of JobConfig.
#pragma once

#include <cstdint>
#include <vector>

namespace zerod {

struct ElasticityConfig {
  bool enabled = false;
  // Required when enabled (DeepSpeed's defaults apply only to a disabled section).
  int64_t max_train_batch_size = 2000;
  std::vector<int64_t> micro_batch_sizes = {2, 4, 6};
  // The GPU counts the batch is chosen for (v0.2: divided by num_gpus_per_node into node counts).
  int64_t min_gpus = 1;
  int64_t max_gpus = 10000;
  // Minutes a scheduler lets the job run before it rescales it; no effect in zerod.
  double min_time = 0.0;
  double version = 0.2;  // 0.1 | 0.2 (DeepSpeed's LATEST_ELASTICITY_VERSION is the default)
  bool prefer_larger_batch = true;
  // false: a job that also sets train_batch_size, train_micro_batch_size_per_gpu or
  // gradient_accumulation_steps is refused; true: they are ignored (with a warning).
  bool ignore_non_elastic_batch_info = false;
  // v0.2: world sizes are counted in whole nodes of this many ranks, each holding
  // num_gpus_per_node / model_parallel_size data-parallel ranks.
  int64_t num_gpus_per_node = 1;
  int64_t model_parallel_size = 1;  // v0.2 only; zerod: parallelism's ranks of one replica

  bool v01() const { return version == 0.1; }
  bool operator==(const ElasticityConfig&) const = default;
};

}  // namespace zerod
