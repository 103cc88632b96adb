// `zerod eval`: the validation loss and perplexity of a model over a job's validation data, on
// one rank. The weights: a checkpoint directory (its newest complete checkpoint), a Hugging
// Face directory, or, without a source, the job's own (train.checkpoint_dir's latest when it has
// one, else model.init_from or the seeded initialisation).
#pragma once

#include <cstdint>
#include <string>

#include "engine/config/job_config.h"

namespace zerod {

struct EvalOptions {
  std::string from;    // "" or a checkpoint dir or a Hugging Face directory
  int64_t tokens = 0;  // > 0: evaluate about this many tokens (whole micro-batches), else all
};

struct EvalResult {
  double loss = 0;
  double perplexity = 0;
  int64_t tokens = 0;  // tokens whose loss was averaged
  std::string source;  // where the weights came from
};

// cfg: a parsed job (resolved here for one rank). InputError without validation data or for a
// bad source.
EvalResult evaluate_job(JobConfig cfg, const EvalOptions& options);

}  // namespace zerod
