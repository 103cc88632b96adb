// `zerod eval`: the validation loss and perplexity of a model over a job's validation data, on
// one rank. The weights: a checkpoint directory (its newest complete checkpoint), a Hugging
// Face directory, or, without a source, the job's own (train.checkpoint_dir's latest when it has
// one, else model.init_from or the seeded initialisation).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/config/job_config.h"

namespace zerod {

struct EvalOptions {
  std::string from;    // "" or a checkpoint dir or a Hugging Face directory
  int64_t tokens = 0;  // > 0: evaluate about this many tokens (whole micro-batches), else all
  // The sample: the first validation sample's first sample_prompt tokens and the model's greedy
  // continuation of sample_tokens tokens (0: no sample). Only when the weights come from a
  // directory (a checkpoint or Hugging Face one) that generate() can load.
  int sample_prompt = 16;
  int sample_tokens = 32;
};

struct EvalSample {
  std::vector<int32_t> prompt;     // the first tokens of the first validation sample
  std::vector<int32_t> generated;  // the model's greedy continuation
};

struct EvalResult {
  double loss = 0;
  double perplexity = 0;
  int64_t tokens = 0;  // tokens whose loss was averaged
  std::string source;  // where the weights came from
  std::optional<EvalSample> sample;
  // Where generate() and the tokenizer lookup find the weights: a checkpoint dir or a Hugging
  // Face directory ("" for the seeded initialisation or a single safetensors file).
  std::string weights_dir;
};

// cfg: a parsed job (resolved here for one rank). InputError without validation data or for a
// bad source.
EvalResult evaluate_job(JobConfig cfg, const EvalOptions& options);

}  // namespace zerod
