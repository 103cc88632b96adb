#include "kernels/cpu/encoder.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace zerod::cpu {

void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                     int T, int C, const int32_t* doc_start) {
  const int64_t rows = static_cast<int64_t>(B) * T;
  const bool par = rows * C >= kParallelMinElems;
  // A token < 0 (not in this vocabulary shard) has no wte row: its term is 0, so the row is
  // wpe[t] copied, or zeros without a position embedding.
  if (wpe == nullptr) {
#pragma omp parallel for schedule(static) if (par)
    for (int64_t r = 0; r < rows; ++r) {
      float* o = out + r * C;
      if (tokens[r] < 0) {
        std::fill(o, o + C, 0.0f);
        continue;
      }
      const float* e = wte + static_cast<int64_t>(tokens[r]) * C;
      std::copy(e, e + C, o);
    }
    return;
  }
#pragma omp parallel for schedule(static) if (par)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = r % T;
    const float* p = wpe + (doc_start != nullptr ? t - doc_start[r] : t) * C;
    float* o = out + r * C;
    if (tokens[r] < 0) {
      std::copy(p, p + C, o);
      continue;
    }
    const float* e = wte + static_cast<int64_t>(tokens[r]) * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
  }
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                      int T, int C, const int32_t* doc_start) {
  const int64_t rows = static_cast<int64_t>(B) * T;
  if (rows == 0) return;
  const bool par = rows * C >= kParallelMinElems;

  // dwpe[t] += sum over b of dout[b,t], b in increasing order: partitioned by t.
  if (dwpe != nullptr && doc_start != nullptr) {
    // dwpe[t - doc_start[b,t]] += dout[b,t], rows in (b, t) order: partitioned by channels.
    constexpr int kChunk = 64;
    const int chunks = (C + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (par && chunks > 1)
    for (int ci = 0; ci < chunks; ++ci) {
      const int c0 = ci * kChunk, c1 = std::min(C, c0 + kChunk);
      for (int64_t r = 0; r < rows; ++r) {
        float* d = dwpe + (r % T - doc_start[r]) * C;
        const float* g = dout + r * C;
#pragma omp simd
        for (int c = c0; c < c1; ++c) d[c] += g[c];
      }
    }
  } else if (dwpe != nullptr) {
#pragma omp parallel for schedule(static) if (par)
    for (int t = 0; t < T; ++t) {
      float* d = dwpe + static_cast<int64_t>(t) * C;
      for (int b = 0; b < B; ++b) {
        const float* g = dout + (static_cast<int64_t>(b) * T + t) * C;
#pragma omp simd
        for (int c = 0; c < C; ++c) d[c] += g[c];
      }
    }
  }

  // dwte: group positions by token (sorted by (token, position)); each distinct token's row is
  // then accumulated by one thread in position order. Tokens < 0 (no row in this vocabulary
  // shard) sort first and their groups are skipped: they contribute to dwpe only.
  std::vector<int64_t> order(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) order[static_cast<size_t>(r)] = r;
  std::stable_sort(order.begin(), order.end(),
                   [tokens](int64_t a, int64_t b) { return tokens[a] < tokens[b]; });
  std::vector<int64_t> starts;  // index into `order` where each distinct token begins
  starts.reserve(static_cast<size_t>(rows) + 1);
  for (int64_t i = 0; i < rows; ++i) {
    if (i == 0 ||
        tokens[order[static_cast<size_t>(i)]] != tokens[order[static_cast<size_t>(i - 1)]])
      starts.push_back(i);
  }
  const int64_t groups = static_cast<int64_t>(starts.size());
  starts.push_back(rows);
#pragma omp parallel for schedule(dynamic, 16) if (par)
  for (int64_t gi = 0; gi < groups; ++gi) {
    const int64_t begin = starts[static_cast<size_t>(gi)];
    const int64_t end = starts[static_cast<size_t>(gi) + 1];
    const int32_t token = tokens[order[static_cast<size_t>(begin)]];
    if (token < 0) continue;
    float* d = dwte + static_cast<int64_t>(token) * C;
    for (int64_t i = begin; i < end; ++i) {
      const float* g = dout + order[static_cast<size_t>(i)] * C;
#pragma omp simd
      for (int c = 0; c < C; ++c) d[c] += g[c];
    }
  }
}

}  // namespace zerod::cpu
