#include "kernels/cpu/rope.h"

#include "core/error.h"
#include "kernels/cpu/parallel.h"

namespace zerod::cpu {

namespace {

// sign = +1: forward rotation by the angle; -1: the inverse rotation.
template <int kSign>
void rotate(float* qkv, const float* cos, const float* sin, const AttentionShape& s) {
  ZD_CHECK(s.HS > 0 && s.HS % 2 == 0, "rope needs an even head size, got HS={}", s.HS);
  ZD_CHECK(s.NH >= 0 && s.KVH >= 0 && s.B >= 0 && s.T >= 0, "rope shape B={} T={} NH={} KVH={}",
           s.B, s.T, s.NH, s.KVH);
  const int half = s.HS / 2;
  const int heads = s.NH + s.KVH;
  const int64_t R = s.qkv_row();
  const int64_t rows = static_cast<int64_t>(s.B) * s.T;
#pragma omp parallel for schedule(static) if (rows * heads * s.HS >= kParallelMinElems)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = r % s.T - (s.doc_start != nullptr ? s.doc_start[r] : 0);
    const float* c = cos + t * half;
    const float* sn = sin + t * half;
    float* row = qkv + r * R;
    for (int h = 0; h < heads; ++h) {
      float* x1 = row + static_cast<int64_t>(h) * s.HS;
      float* x2 = x1 + half;
#pragma omp simd
      for (int i = 0; i < half; ++i) {
        const float a = x1[i], b = x2[i];
        const float si = kSign * sn[i];
        x1[i] = a * c[i] - b * si;
        x2[i] = b * c[i] + a * si;
      }
    }
  }
}

}  // namespace

void rope_forward(float* qkv, const float* cos, const float* sin, const AttentionShape& s) {
  rotate<+1>(qkv, cos, sin, s);
}

void rope_backward(float* dqkv, const float* cos, const float* sin, const AttentionShape& s) {
  rotate<-1>(dqkv, cos, sin, s);
}

}  // namespace zerod::cpu
