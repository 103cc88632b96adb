// bf16_gemm (kernels/cpu/bf16_gemm.h) against a double-precision product of the same bf16
// operands: every transpose, odd sizes, padded leading dimensions, beta 0 (C's NaN never read) and
// beta 1 (accumulate), bias, K == 0; fp32 inputs that are not bf16 values are rounded to nearest
// even first; and the CPU backend in bf16 mode routing its matmuls through it. Skips where bf16
// products cannot run (no oneDNN build, or a CPU without avx512_bf16), saying why.
#include "kernels/cpu/bf16_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/crossentropy.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/matmul.h"

namespace zerod::cpu {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct Case {
  bool ta, tb;
  int64_t M, N, K;
  float beta;
  bool bias;
  int64_t pad;
};

// C = op(A) op(B) + beta C (+ bias) in double from the bf16-rounded operands.
std::vector<double> reference(const Case& c, const std::vector<float>& A, int64_t lda,
                              const std::vector<float>& B, int64_t ldb, const std::vector<float>& C,
                              int64_t ldc, const std::vector<float>& bias) {
  std::vector<double> out(static_cast<size_t>(c.M * c.N));
  for (int64_t i = 0; i < c.M; ++i) {
    for (int64_t j = 0; j < c.N; ++j) {
      double acc = 0.0;
      for (int64_t k = 0; k < c.K; ++k) {
        const float a = c.ta ? A[k * lda + i] : A[i * lda + k];
        const float b = c.tb ? B[j * ldb + k] : B[k * ldb + j];
        acc += static_cast<double>(round_bf16(a)) * round_bf16(b);
      }
      if (c.beta != 0.0f) acc += static_cast<double>(c.beta) * C[i * ldc + j];
      if (c.bias) acc += bias[static_cast<size_t>(j)];
      out[static_cast<size_t>(i * c.N + j)] = acc;
    }
  }
  return out;
}

TEST(Bf16Gemm, MatchesADoubleProductOfTheBf16Operands) {
  const std::string why = bf16_gemm_unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  const Case cases[] = {
      {false, true, 37, 70, 50, 0.0f, true, 0},    // matmul forward: inp x W^T + bias
      {false, false, 64, 48, 96, 1.0f, false, 3},  // dinp += dout x W
      {true, false, 33, 65, 129, 1.0f, false, 0},  // dW += dout^T x inp
      {true, true, 17, 9, 31, 0.0f, false, 5},    {false, true, 128, 256, 512, 0.0f, false, 0},
      {false, false, 5, 7, 0, 1.0f, true, 0},  // K == 0: beta C + bias
  };
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.ta ? "T" : "N") + (c.tb ? "T" : "N") + " M=" + std::to_string(c.M) +
                 " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
                 " beta=" + std::to_string(c.beta));
    const int64_t lda = (c.ta ? c.M : c.K) + c.pad, ldb = (c.tb ? c.K : c.N) + c.pad;
    const int64_t ldc = c.N + c.pad;
    // Unrounded fp32 operands (the kernel rounds them), NaN in the padding (never read).
    std::vector<float> A(static_cast<size_t>((c.ta ? c.K : c.M) * lda + 1), kNaN);
    std::vector<float> B(static_cast<size_t>((c.tb ? c.N : c.K) * ldb + 1), kNaN);
    for (int64_t r = 0; r < (c.ta ? c.K : c.M); ++r)
      for (int64_t k = 0; k < (c.ta ? c.M : c.K); ++k) A[r * lda + k] = u(rng);
    for (int64_t r = 0; r < (c.tb ? c.N : c.K); ++r)
      for (int64_t k = 0; k < (c.tb ? c.K : c.N); ++k) B[r * ldb + k] = u(rng);
    std::vector<float> C(static_cast<size_t>(c.M * ldc), kNaN), bias(static_cast<size_t>(c.N));
    for (int64_t i = 0; i < c.M; ++i)
      for (int64_t j = 0; j < c.N; ++j) C[i * ldc + j] = c.beta != 0.0f ? u(rng) : kNaN;
    for (float& b : bias) b = u(rng);
    const std::vector<double> want = reference(c, A, lda, B, ldb, C, ldc, bias);
    bf16_gemm(c.ta, c.tb, c.M, c.N, c.K, A.data(), lda, B.data(), ldb, c.beta, C.data(), ldc,
              c.bias ? bias.data() : nullptr);
    for (int64_t i = 0; i < c.M; ++i) {
      for (int64_t j = 0; j < c.N; ++j) {
        const double w = want[static_cast<size_t>(i * c.N + j)];
        // fp32 accumulation of K exact products: a few ulps of the sum of |terms|.
        ASSERT_NEAR(C[i * ldc + j], w, 1e-5 * (1.0 + std::sqrt(static_cast<double>(c.K))))
            << i << "," << j;
      }
      for (int64_t j = c.N; j < ldc; ++j) ASSERT_TRUE(std::isnan(C[i * ldc + j]));  // untouched
    }
  }
}

// Operands converted once (to_bf16) give the float entry point's result bit for bit, and
// operands of the wrong shape for the product are refused.
TEST(Bf16Gemm, ConvertedOperandsGiveTheSameBitsAndMustFit) {
  const std::string why = bf16_gemm_unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  const int64_t M = 19, N = 23, K = 40;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> A(M * K), B(N * K);
  for (float& x : A) x = u(rng);
  for (float& x : B) x = u(rng);
  std::vector<float> c1(M * N), c2(M * N);
  bf16_gemm(false, true, M, N, K, A.data(), K, B.data(), K, 0.0f, c1.data(), N);
  std::vector<uint16_t> a16, b16;
  const Bf16Operand a = to_bf16(a16, A.data(), M, K, K), b = to_bf16(b16, B.data(), N, K, K);
  EXPECT_EQ(a.rows, M);
  EXPECT_EQ(b.cols, K);
  bf16_gemm(false, true, M, N, K, a, b, 0.0f, c2.data(), N);
  EXPECT_EQ(c1, c2);
  EXPECT_THROW(bf16_gemm(false, false, M, N, K, a, b, 0.0f, c2.data(), N), Error);
}

// The CPU backend in bf16 mode multiplies bf16 operands where it can: its matmuls equal
// bf16_gemm's, and stay within fp32 accumulation noise of the fp32 backend on the same bf16
// values (the products of bf16 values are exact in fp32).
// Uniform bf16 values in [-scale, scale): values(n).
struct Bf16Values {
  std::mt19937 rng;
  std::uniform_real_distribution<float> u;
  Bf16Values(unsigned seed, float scale) : rng(seed), u(-scale, scale) {}
  std::vector<float> operator()(int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = round_bf16(u(rng));
    return v;
  }
};

TEST(Bf16Gemm, TheBf16BackendRoutesItsMatmulsThroughIt) {
  const std::string why = bf16_gemm_unavailable();
  CpuBackend bf16(DType::kBF16), fp32(DType::kF32);
  EXPECT_FALSE(fp32.bf16_products());
  EXPECT_EQ(bf16.bf16_products(), why.empty() && std::getenv("ZEROD_CPU_BF16_GEMM") == nullptr);
  EXPECT_NE(bf16_products_note().find("bf16 on the CPU"), std::string::npos);
  if (!bf16.bf16_products()) GTEST_SKIP() << bf16_products_note();
  const int64_t N = 65;
  const int C = 96, OC = 130;
  Bf16Values values(11, 1.0f);
  const std::vector<float> inp = values(N * C), w = values(int64_t{OC} * C), b = values(OC);
  const std::vector<float> dout = values(N * OC);
  std::vector<float> out_bf(N * OC), out_fp(N * OC), want(N * OC);
  bf16.matmul_forward(out_bf.data(), inp.data(), w.data(), b.data(), N, C, OC);
  fp32.matmul_forward(out_fp.data(), inp.data(), w.data(), b.data(), N, C, OC);
  bf16_gemm(false, true, N, OC, C, inp.data(), C, w.data(), C, 0.0f, want.data(), OC, b.data());
  EXPECT_EQ(out_bf, want);
  for (size_t i = 0; i < out_bf.size(); ++i) ASSERT_NEAR(out_bf[i], out_fp[i], 1e-4) << i;
  std::vector<float> dinp_bf(N * C, 0.5f), dinp_fp(N * C, 0.5f);
  std::vector<float> dw_bf(int64_t{OC} * C, 0.25f), dw_fp(int64_t{OC} * C, 0.25f);
  std::vector<float> db_bf(OC, 0.0f), db_fp(OC, 0.0f);
  bf16.matmul_backward(dinp_bf.data(), dw_bf.data(), db_bf.data(), dout.data(), inp.data(),
                       w.data(), N, C, OC, true);
  fp32.matmul_backward(dinp_fp.data(), dw_fp.data(), db_fp.data(), dout.data(), inp.data(),
                       w.data(), N, C, OC, true);
  for (size_t i = 0; i < dinp_bf.size(); ++i) ASSERT_NEAR(dinp_bf[i], dinp_fp[i], 1e-4) << i;
  for (size_t i = 0; i < dw_bf.size(); ++i) ASSERT_NEAR(dw_bf[i], dw_fp[i], 1e-4) << i;
  EXPECT_EQ(db_bf, db_fp);  // the bias gradient is the same column sums either way
}

TEST(Bf16Gemm, TheHeadBackwardTakesTheFusedCrossEntropysBf16DlogitsWithTheSameBits) {
  // The bf16 backend's crossentropy_fused writes the dlogits also as bf16 and the next
  // matmul_backward reading them uses those: the same bits as converting them (the plain
  // kernels), for the head's products, its bias sums, and a second backward on the same buffer
  // (which converts again, since its values may have changed).
  CpuBackend bf16(DType::kBF16);
  if (!bf16.bf16_products()) GTEST_SKIP() << bf16_products_note();
  const int64_t N = 9;
  const int C = 40, V = 301, Vp = 320;
  Bf16Values values(12, 3.0f);
  const std::vector<float> inp = values(N * C), w = values(int64_t{Vp} * C);
  const std::vector<float> logits = values(N * Vp);
  const std::vector<int32_t> targets = {0, 300, -1, 17, 5, 299, 100, 2, 64};
  std::vector<float> d = logits, loss(N);
  bf16.crossentropy_fused(loss.data(), d.data(), targets.data(), N, V, Vp, 0.5f);
  std::vector<float> want_d = logits, want_loss(N);
  crossentropy_fused(want_loss.data(), want_d.data(), targets.data(), N, V, Vp, 0.5f, DType::kBF16);
  ASSERT_EQ(d, want_d);
  std::vector<float> dinp(N * C), dw(int64_t{Vp} * C, 0.125f), db(Vp, 0.0f);
  std::vector<float> want_dinp(N * C), want_dw = dw, want_db = db;
  auto backward_matches_the_plain_kernel = [&] {
    bf16.matmul_backward(dinp.data(), dw.data(), db.data(), d.data(), inp.data(), w.data(), N, C,
                         Vp, false);
    matmul_backward(want_dinp.data(), want_dw.data(), want_db.data(), d.data(), inp.data(),
                    w.data(), N, C, Vp, false, true);
    EXPECT_EQ(dinp, want_dinp);
    EXPECT_EQ(dw, want_dw);
    EXPECT_EQ(db, want_db);
  };
  backward_matches_the_plain_kernel();
  // The bf16 copy is used once: change the dlogits, and the next backward reads the new values.
  for (float& x : d) x = round_bf16(x * 0.5f + 0.25f);
  backward_matches_the_plain_kernel();
}

}  // namespace
}  // namespace zerod::cpu
