#include "model/document_mask.h"

namespace zerod {

void document_starts(const int32_t* inputs, int B, int T, int32_t eos_token_id,
                     int32_t* doc_start) {
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* in = inputs + b * T;
    int32_t* ds = doc_start + b * T;
    int32_t start = 0;
    for (int t = 0; t < T; ++t) {
      if (t > 0 && in[t - 1] == eos_token_id) start = t;
      ds[t] = start;
    }
  }
}

}  // namespace zerod
