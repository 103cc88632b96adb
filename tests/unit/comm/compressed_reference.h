// A plain one-process reference of the 1-bit compressed all-reduce (comm/compressed_allreduce.h):
// unpacked signs, every rank's worker error and every server's error side by side.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "comm/compressed_allreduce.h"

namespace zerod::test {

inline size_t S(int64_t i) {
  return static_cast<size_t>(i);
}
inline float sgn(float v) {
  return v < 0.0f ? -1.0f : 1.0f;
}
inline float rms(const std::vector<float>& y) {
  double ss = 0;
  for (float v : y) ss += static_cast<double>(v) * v;
  return static_cast<float>(std::sqrt(ss) / std::sqrt(static_cast<double>(y.size())));
}

// The algorithm on plain float vectors: every rank's worker error and every server's error.
struct CompressedReference {
  int world;
  int64_t n, P, C;
  std::vector<std::vector<float>> worker, server;
  CompressedReference(int w, int64_t n_) : world(w), n(n_) {
    P = CompressedAllReduce::padded_elems(n, w);
    C = P / w;
    worker.assign(S(w), std::vector<float>(S(P), 0.0f));
    server.assign(S(w), std::vector<float>(S(C), 0.0f));
  }
  std::vector<float> run(const std::vector<std::vector<float>>& x) {
    std::vector<std::vector<float>> y(S(world));
    std::vector<float> s(S(world));
    for (int r = 0; r < world; ++r) {
      auto& yr = y[S(r)];
      auto& we = worker[S(r)];
      yr.assign(S(P), 0.0f);
      for (int64_t i = 0; i < n; ++i) yr[S(i)] = x[S(r)][S(i)];
      for (int64_t i = 0; i < P; ++i) yr[S(i)] += we[S(i)];
      s[S(r)] = rms(yr);
      for (int64_t i = 0; i < P; ++i) we[S(i)] = yr[S(i)] - s[S(r)] * sgn(yr[S(i)]);
    }
    std::vector<float> out(S(P));
    for (int c = 0; c < world; ++c) {
      std::vector<float> z(S(C), 0.0f);
      for (int q = 0; q < world; ++q) {
        const float w = s[S(q)] * (1.0f / static_cast<float>(world));
        for (int64_t i = 0; i < C; ++i) z[S(i)] += sgn(y[S(q)][S(c * C + i)]) * w;
      }
      auto& se = server[S(c)];
      for (int64_t i = 0; i < C; ++i) z[S(i)] += se[S(i)];
      const float t = rms(z);
      for (int64_t i = 0; i < C; ++i) {
        se[S(i)] = z[S(i)] - t * sgn(z[S(i)]);
        out[S(c * C + i)] = t * sgn(z[S(i)]);
      }
    }
    out.resize(S(n));
    return out;
  }
};

}  // namespace zerod::test
