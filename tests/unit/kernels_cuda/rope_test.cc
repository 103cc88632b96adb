// Rotary position embedding of the CUDA backend against the CPU reference (metric and limits:
// cuda_test_util.h), on the q and k heads of MHA and GQA qkv rows. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "cuda_test_util.h"

namespace zerod {
namespace {

using test::Backends;
using test::VecF;

struct Shape {
  int B, T, NH, KVH, HS;
};
constexpr Shape kShapes[] = {
    {2, 17, 4, 2, 64}, {1, 33, 3, 3, 16}, {2, 5, 4, 1, 128}, {1, 3, 2, 1, 2}};

AttentionShape attention_shape(const Shape& s) {
  AttentionShape a;
  a.B = s.B;
  a.T = s.T;
  a.NH = s.NH;
  a.KVH = s.KVH;
  a.HS = s.HS;
  return a;
}

std::string label(DType dt, const Shape& s) {
  return std::string(dtype_name(dt)) + " B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
         " NH=" + std::to_string(s.NH) + " KVH=" + std::to_string(s.KVH) +
         " HS=" + std::to_string(s.HS);
}

// cos / sin (T, HS/2) of the usual frequencies theta^(-2i/HS) at positions pos0 .. pos0+T-1.
void tables(int T, int HS, int pos0, VecF* cos, VecF* sin) {
  const int half = HS / 2;
  cos->resize(static_cast<size_t>(T) * half);
  sin->resize(cos->size());
  for (int t = 0; t < T; ++t) {
    for (int i = 0; i < half; ++i) {
      const double f = std::pow(10000.0, -2.0 * i / HS);
      const double a = (pos0 + t) * f;
      (*cos)[static_cast<size_t>(t) * half + i] = static_cast<float>(std::cos(a));
      (*sin)[static_cast<size_t>(t) * half + i] = static_cast<float>(std::sin(a));
    }
  }
}

TEST(CudaRope, ForwardAndBackwardMatchTheCpu) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  for (DType dt : test::kAllDtypes) {
    for (const Shape& sh : kShapes) {
      SCOPED_TRACE(label(dt, sh));
      const AttentionShape s = attention_shape(sh);
      Backends be(dt);
      const int64_t n = int64_t{s.B} * s.T * s.qkv_row();
      VecF cos, sin;
      tables(s.T, s.HS, 7, &cos, &sin);
      Buffer d_cos = be.f32(cos), d_sin = be.f32(sin);

      VecF qkv = be.round(test::randn(n, 180));
      Buffer d_qkv = be.compute(qkv);
      be.cpu->rope_forward(qkv.data(), cos.data(), sin.data(), s);
      be.gpu->rope_forward(d_qkv.data(), d_cos.as<float>(), d_sin.as<float>(), s);
      // (v heads are untouched on both sides: compared exactly as part of the whole tensor.)
      EXPECT_TRUE(test::close(be.read_compute(d_qkv, n), qkv, test::tolerance(dt)));

      VecF dqkv = be.round(test::randn(n, 181));
      Buffer d_dqkv = be.compute(dqkv);
      be.cpu->rope_backward(dqkv.data(), cos.data(), sin.data(), s);
      be.gpu->rope_backward(d_dqkv.data(), d_cos.as<float>(), d_sin.as<float>(), s);
      EXPECT_TRUE(test::close(be.read_compute(d_dqkv, n), dqkv, test::tolerance(dt)));
    }
  }
}

// backward(forward(x)) = x (a rotation and its transpose), up to fp32 rounding; v untouched.
TEST(CudaRope, BackwardInvertsForward) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  Backends be(DType::kF32);
  const AttentionShape s = attention_shape({2, 9, 4, 2, 32});
  const int64_t n = int64_t{s.B} * s.T * s.qkv_row();
  VecF cos, sin;
  tables(s.T, s.HS, 0, &cos, &sin);
  Buffer d_cos = be.f32(cos), d_sin = be.f32(sin);
  const VecF x = test::randn(n, 190);
  Buffer d_x = be.compute(x);
  be.gpu->rope_forward(d_x.data(), d_cos.as<float>(), d_sin.as<float>(), s);
  be.gpu->rope_backward(d_x.data(), d_cos.as<float>(), d_sin.as<float>(), s);
  EXPECT_TRUE(test::close(be.read_compute(d_x, n), x, 1e-6));
}

// Document masking: row (b,t) rotated by the table row t - doc_start[b,t].
TEST(CudaRope, DocumentMaskingMatchesTheCpu) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  const test::VecI ds = {0, 0, 0, 3, 4, 4, 4, 4, 4, 0, 0, 0, 0, 0, 0, 6, 6, 6};  // (2, 9)
  for (DType dt : test::kAllDtypes) {
    SCOPED_TRACE(dtype_name(dt));
    AttentionShape s = attention_shape({2, 9, 4, 2, 32});
    Backends be(dt);
    const int64_t n = int64_t{s.B} * s.T * s.qkv_row();
    VecF cos, sin;
    tables(s.T, s.HS, 0, &cos, &sin);
    Buffer d_cos = be.f32(cos), d_sin = be.f32(sin), d_ds = be.i32(ds);
    VecF qkv = be.round(test::randn(n, 200)), dqkv = be.round(test::randn(n, 201));
    Buffer d_qkv = be.compute(qkv), d_dqkv = be.compute(dqkv);
    s.doc_start = ds.data();
    be.cpu->rope_forward(qkv.data(), cos.data(), sin.data(), s);
    be.cpu->rope_backward(dqkv.data(), cos.data(), sin.data(), s);
    s.doc_start = d_ds.as<int32_t>();
    be.gpu->rope_forward(d_qkv.data(), d_cos.as<float>(), d_sin.as<float>(), s);
    be.gpu->rope_backward(d_dqkv.data(), d_cos.as<float>(), d_sin.as<float>(), s);
    EXPECT_TRUE(test::close(be.read_compute(d_qkv, n), qkv, test::tolerance(dt)));
    EXPECT_TRUE(test::close(be.read_compute(d_dqkv, n), dqkv, test::tolerance(dt)));
  }
}

}  // namespace
}  // namespace zerod
