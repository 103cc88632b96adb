// The shape of a GPT-2-architecture model.
#pragma once

#include <cstdint>

namespace zerod {

struct GptSpec {
  int n_layer = 12;
  int n_head = 12;
  int n_embd = 768;           // C
  int vocab_size = 50257;     // V: the real vocabulary, the loss covers these columns
  int padded_vocab_size = 0;  // Vp: V rounded up to a multiple of 128 (0: derive)
  int seq_len = 1024;         // max T (rows of the position embedding)
  double init_std = 0.02;

  int head_size() const { return n_embd / n_head; }
  int vp() const {
    return padded_vocab_size > 0 ? padded_vocab_size : (vocab_size + 127) / 128 * 128;
  }

  // Real parameters (as Hugging Face counts them: vocab and positions unpadded).
  int64_t num_parameters() const;
  // Parameters as stored (vocabulary padded to Vp): what the matmuls actually multiply.
  int64_t num_parameters_padded() const;
  // Training FLOPs per token (forward + backward) at sequence length T, llm.c's convention:
  // 6 * parameters (padded) + 6 * n_layer * T * C for attention (QK^T and PV forward and
  // backward, halved for the causal mask). The CPU benchmark shape gives 98.2 MFLOP/token.
  double flops_per_token(int T) const;
};

}  // namespace zerod
