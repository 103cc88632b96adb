// DeepSpeed's elastic batch computation (deepspeed/elasticity/elasticity.py:
// compute_elastic_config, _get_compatible_gpus_v01 / _v02 and their helpers), as pure functions
// of an ElasticityConfig: the global batch that the most world sizes in [min_gpus, max_gpus]
// can train with some micro-batch of micro_batch_sizes and a whole gradient accumulation, those
// world sizes, and for one of them the micro-batch and accumulation.
//
//   v0.1: each micro-batch size and their LCM, scaled by the largest highly composite number
//   that keeps it <= max_train_batch_size, is a candidate; the one with the most data-parallel
//   sizes d in [min_gpus, max_gpus] where batch / d is a multiple of a micro-batch size wins
//   (ties: the larger batch with prefer_larger_batch, else the smaller).
//   v0.2: the same over nodes (num_gpus_per_node ranks, num_gpus_per_node / model_parallel_size
//   data-parallel ranks each); a world whose data-parallel size is not in that list gets a batch
//   of its own (the largest, or smallest, multiple of micro x data-parallel size within
//   max_train_batch_size), with its own size as the only valid one.
//
//   ElasticTriangle t = elastic_triangle(cfg.elasticity, 8, 1);
//   // t.train_batch_size == t.micro_batch * t.grad_accum * t.data_parallel_size
//
// Errors are ConfigError problems naming the elasticity key (or the world size) and the values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/config/elasticity_config.h"

namespace zerod {

struct JobConfig;

struct ElasticBatch {
  int64_t train_batch_size = 0;
  std::vector<int64_t> valid_sizes;  // data-parallel sizes, ascending
  // v0.2: the world's data-parallel size is not in the shared list: its own batch.
  bool own_batch = false;
};

// The batch and the data-parallel sizes that do not depend on the world size: v0.1's, and
// v0.2's node-granular list (DeepSpeed's _get_compatible_gpus_v01 result, scaled to
// data-parallel ranks for v0.2; empty in v0.2 when no node count fits and prefer_larger_batch).
// Throws ConfigError: model_parallel_size > 1 in v0.1, num_gpus_per_node not divisible by
// model_parallel_size, a micro-batch size above the (per-node) max_train_batch_size, no valid
// size.
ElasticBatch elastic_shared_batch(const ElasticityConfig& c);

// DeepSpeed's batch for `num_gpus` ranks (v0.2's current_num_gpus; v0.1 does not use it): the
// shared batch when num_gpus / model_parallel_size is among its sizes, else v0.2's own batch for
// this world. The batch can be 0 (no multiple of micro x data-parallel size within the cap).
ElasticBatch elastic_batch(const ElasticityConfig& c, int64_t num_gpus);

// The largest of micro_batch_sizes that divides batch / ranks (DeepSpeed's pick); 0 when none.
int64_t elastic_micro_batch(const ElasticityConfig& c, int64_t batch, int64_t ranks);

struct ElasticTriangle {
  int64_t train_batch_size = 0;
  int64_t micro_batch = 0;
  int64_t grad_accum = 0;
  int64_t data_parallel_size = 0;
};

// The batch triangle for `world_size` ranks of which each model replica takes `model_ranks`
// (parallelism's pipeline x tensor x context; must divide world_size). DeepSpeed's engine:
// compute_elastic_config for the data-parallel size, accumulation = batch // (micro x dp).
// v0.2 is given the world size (its ranks, which it divides by model_parallel_size itself).
// Throws ConfigError naming the world size and the valid ones when it is not among them.
ElasticTriangle elastic_triangle(const ElasticityConfig& c, int64_t world_size, int model_ranks);

// DeepSpeed's ensure_immutable_elastic_config: the resource scheduler's copy of the section
// (`scheduler_json`, the DEEPSPEED_ELASTICITY_CONFIG variable DeepSpeed's launcher sets, read
// with this section's defaults) must agree with the job's on max_train_batch_size,
// micro_batch_sizes and version, or the scheduler would scale the job to world sizes its batch
// does not fit. Throws ConfigError naming the variable and both values.
void check_scheduler_elastic_config(const ElasticityConfig& ours,
                                    const std::string& scheduler_json);

// For `zerod check`: the valid world sizes and each one's triangle, and this job's
// (cfg resolved, elasticity enabled). Lines ending in '\n'.
std::string format_elastic_plan(const JobConfig& cfg);
// One line for the log: "elasticity v0.1: world size 2 -> micro-batch 6 x ...".
std::string elastic_summary(const JobConfig& cfg);

}  // namespace zerod
