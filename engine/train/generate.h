// Text generation with a trained model: `zerod generate`. The weights come from a checkpoint
// directory (its newest complete checkpoint, or a tag) or a Hugging Face model directory; the
// prompt is run once (prefill) into a KV cache, then one token at a time is appended, greedy or
// sampled (temperature, top-k, top-p, as transformers applies them), reproducibly by seed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace zerod {

struct GenerateOptions {
  std::string from;             // checkpoint dir (train.checkpoint_dir) or HF directory
  std::string tag = "latest";   // which checkpoint, for a checkpoint dir
  std::vector<int32_t> prompt;  // token ids, at least one
  int max_new_tokens = 32;
  double temperature = 0.0;  // 0: greedy (argmax); > 0: sample from softmax(logits / T)
  int top_k = 0;             // > 0: sample among the k most likely tokens
  double top_p = 1.0;        // < 1: among the fewest tokens whose probability reaches p
  uint64_t seed = 0;
  std::optional<int32_t> eos_token;  // stop after generating it
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // the new tokens (not the prompt)
  double load_seconds = 0, prefill_seconds = 0, decode_seconds = 0;
  std::string model;  // what was loaded, for the log
};

// InputError (exit 2) for a bad source, a token outside the vocabulary, or a prompt plus new
// tokens beyond a GPT-2 model's positions (seq_len).
GenerateResult generate(const GenerateOptions& options);

// The next token from one position's logits (V real columns): argmax for temperature 0, else a
// draw from the tempered, top-k / top-p filtered distribution with uniform u in [0, 1).
int32_t pick_token(const float* logits, int V, const GenerateOptions& o, double u);

}  // namespace zerod
