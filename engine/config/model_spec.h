// The model shape of a job (ModelConfig) as the model code takes it (GptSpec). Header-only, so
// that engine/config itself does not depend on model/.
#pragma once

#include "engine/config/job_config.h"
#include "model/spec.h"

namespace zerod {

inline GptSpec gpt_spec(const ModelConfig& m) {
  GptSpec s;
  s.n_layer = m.n_layer;
  s.n_head = m.n_head;
  s.n_embd = m.n_embd;
  s.vocab_size = m.vocab_size;
  s.padded_vocab_size = m.padded_vocab_size;
  s.seq_len = m.seq_len;
  s.init_std = m.init_std;
  return s;
}

}  // namespace zerod
