// What `zerod check` shows of a pipeline-parallel job (parallelism.pipeline > 1): each stage's
// layers, parameters and model-state bytes per rank, and the schedule's simulated bubble and
// live micro-batches per rank (parallel/pipeline/simulate.h, unit costs F = 1, B = 2 or
// Bi = W = 1). The model-state bytes are the ZeRO formula (zero_formula_bytes) over the stage's
// parameters at the job's stage, compute dtype and ZeRO group (data x context); the activation
// bytes are the stage models' own allocation for the micro-batches their schedule keeps live.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/config/job_config.h"

namespace zerod {

struct PipelineStagePlan {
  int stage = 0, rank = 0, chunk = 0;  // global stage = chunk x P + rank
  int first_layer = 0, layers = 0;
  bool embedding = false, head = false;  // first stage: embedding; last: final norm + head
  int64_t parameters = 0;  // real parameters of its layers, embedding, final norm and head (the
                           // last stage of a tied model holds a copy of the embedding, as
                           // Megatron does)
};

struct PipelinePlan {
  std::string schedule;
  int ranks = 1, virtual_stages = 1, micro_batches = 1;
  std::vector<PipelineStagePlan> stages;  // global stage order
  std::vector<int64_t> rank_parameters;   // per pipeline rank: its chunks' parameters
  std::vector<int64_t> rank_state_bytes;  // per pipeline rank: weights + grads + optimizer
  std::vector<int> live_micro_batches;    // per pipeline rank: peak (micro-batch x chunk)
  // per pipeline rank: the activation bytes its stage models allocate for their live
  // micro-batches (model_activation_bytes per chunk; zero-bubble: plus split_backward_bytes per
  // micro-batch between Bi and W)
  std::vector<int64_t> rank_activation_bytes;
  double bubble = 0.0;                    // simulated, unit costs
};

// InputError when the partition cannot be made (the config parser reports the same first).
PipelinePlan make_pipeline_plan(const JobConfig& cfg);
std::string format_pipeline_plan(const PipelinePlan& plan);

}  // namespace zerod
