// sgemm (kernels/cpu/gemm.h) against a double-precision reference, for both implementations:
// transposes, odd sizes and sizes around the engine's block sizes, padded leading dimensions,
// alpha/beta/bias, the K == 0 and alpha == 0 shortcuts, and bit-identical results for any
// OpenMP thread count and inside a parallel region.
#include "kernels/cpu/gemm.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/cpu_info.h"
#include "core/error.h"
#include "kernels/cpu/gemm_avx512.h"

namespace zerod::cpu {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct Case {
  bool ta = false, tb = false;
  int64_t M = 0, N = 0, K = 0;
  float alpha = 1.0f, beta = 0.0f;
  bool bias = false;
  int64_t pad = 0;  // added to every leading dimension

  std::string str() const {
    return std::string(ta ? "T" : "N") + (tb ? "T" : "N") + " M=" + std::to_string(M) +
           " N=" + std::to_string(N) + " K=" + std::to_string(K) +
           " alpha=" + std::to_string(alpha) + " beta=" + std::to_string(beta) +
           " bias=" + std::to_string(bias) + " pad=" + std::to_string(pad);
  }
};

// Operands of a case, filled with uniform [-1, 1) values; C is NaN when beta == 0 (it must be
// overwritten, never read), and so is the padding of every matrix (it must never be read into
// a result or written).
struct Operands {
  int64_t lda, ldb, ldc;
  std::vector<float> A, B, C, bias;

  explicit Operands(const Case& c, uint32_t seed) {
    lda = (c.ta ? c.M : c.K) + c.pad;
    ldb = (c.tb ? c.K : c.N) + c.pad;
    ldc = c.N + c.pad;
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    auto fill = [&](std::vector<float>& v, int64_t rows, int64_t cols, int64_t ld, bool nan) {
      v.assign(static_cast<size_t>(std::max<int64_t>(rows * ld, 1)), kNaN);
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) v[i * ld + j] = nan ? kNaN : u(rng);
    };
    fill(A, c.ta ? c.K : c.M, c.ta ? c.M : c.K, lda, false);
    fill(B, c.tb ? c.N : c.K, c.tb ? c.K : c.N, ldb, false);
    fill(C, c.M, c.N, ldc, c.beta == 0.0f);
    bias.resize(static_cast<size_t>(std::max<int64_t>(c.N, 1)));
    for (auto& x : bias) x = u(rng);
  }
  float a(const Case& c, int64_t i, int64_t k) const {
    return c.ta ? A[k * lda + i] : A[i * lda + k];
  }
  float b(const Case& c, int64_t k, int64_t j) const {
    return c.tb ? B[j * ldb + k] : B[k * ldb + j];
  }
};

void run(const Case& c, Operands& op) {
  sgemm(c.ta, c.tb, c.M, c.N, c.K, c.alpha, op.A.data(), op.lda, op.B.data(), op.ldb, c.beta,
        op.C.data(), op.ldc, c.bias ? op.bias.data() : nullptr);
}

// Checks op.C (after the call) against the exact result computed in double from `before`.
//
// Tolerance: an fp32 dot product of length K accumulated with FMAs, in any order and blocking,
// has |error| <= gamma_K * sum_k |a_ik b_kj|, gamma_K = K u / (1 - K u), u = 2^-24. The store
// adds at most three roundings (alpha *, + beta C, + bias), each at most u times the magnitude
// involved. So |error| <= (K + 3) u (1 + tiny) * S with S = |alpha| sum_k |a b| + |beta C| +
// |bias|; we allow 2 (K + 3) u S. A wrong result (a product missing, counted twice, taken from
// the wrong row or column, or a wrong alpha/beta/bias) is off by O(|a b|) ~ S / K on uniform
// data, orders of magnitude above that bound for the K used here.
void expect_matches_reference(const Case& c, const Operands& before, const Operands& op) {
  constexpr double kU = 0x1p-24;
  int64_t bad = 0;
  for (int64_t i = 0; i < c.M; ++i) {
    for (int64_t j = 0; j < op.ldc; ++j) {
      const float got = op.C[i * op.ldc + j];
      if (j >= c.N) {  // padding: untouched (NaN stays NaN)
        if (!std::isnan(got)) ++bad;
        continue;
      }
      double dot = 0.0, mag = 0.0;
      for (int64_t k = 0; k < c.K; ++k) {
        const double p = static_cast<double>(before.a(c, i, k)) * before.b(c, k, j);
        dot += p;
        mag += std::fabs(p);
      }
      double want = static_cast<double>(c.alpha) * dot;
      double scale = std::fabs(c.alpha) * mag;
      if (c.beta != 0.0f) {
        const double old = static_cast<double>(c.beta) * before.C[i * op.ldc + j];
        want += old;
        scale += std::fabs(old);
      }
      if (c.bias) {
        want += before.bias[j];
        scale += std::fabs(before.bias[j]);
      }
      const double tol = 2.0 * (c.K + 3) * kU * scale + 1e-30;
      if (!(std::fabs(got - want) <= tol)) {
        if (bad < 3) {
          ADD_FAILURE() << c.str() << " " << gemm_impl_name(gemm_impl()) << ": C[" << i << "," << j
                        << "] = " << got << ", want " << want << " (tol " << tol << ")";
        }
        ++bad;
      }
    }
  }
  EXPECT_EQ(bad, 0) << c.str() << " " << gemm_impl_name(gemm_impl());
}

void check_case(const Case& c, uint32_t seed) {
  Operands op(c, seed);
  const Operands before = op;
  run(c, op);
  expect_matches_reference(c, before, op);
}

// Restores the implementation and the OpenMP thread count a test changes.
class GemmTest : public ::testing::TestWithParam<GemmImpl> {
 protected:
  void SetUp() override {
    saved_threads_ = omp_get_max_threads();
    if (GetParam() == GemmImpl::kAvx512 && !cpu_info().avx512f) {
      GTEST_SKIP() << "no AVX-512F on this CPU";
    }
    set_gemm_impl(GetParam());
  }
  void TearDown() override {
    set_gemm_impl(GemmImpl::kAuto);
    omp_set_num_threads(saved_threads_);
  }
  int saved_threads_ = 1;
};

TEST_P(GemmTest, OddSizesAllTransposes) {
  const int64_t sizes[] = {1, 3, 14, 17, 33, 65};
  const int64_t ks[] = {1, 17, 385};
  const float alphas[] = {1.0f, 0.5f, -2.0f};
  const float betas[] = {0.0f, 1.0f, -0.75f};
  uint32_t n = 0;
  for (int t = 0; t < 4; ++t)
    for (int64_t M : sizes)
      for (int64_t N : sizes)
        for (int64_t K : ks) {
          Case c;
          c.ta = t & 1;
          c.tb = t & 2;
          c.M = M;
          c.N = N;
          c.K = K;
          c.alpha = alphas[n % 3];
          c.beta = betas[(n / 3) % 3];
          c.bias = n % 2 == 0;
          c.pad = n % 5 == 0 ? 7 : 0;
          check_case(c, n++);
        }
}

TEST_P(GemmTest, LargerAndAroundBlockSizes) {
  using gemm_avx512::kKc;
  using gemm_avx512::kMr;
  using gemm_avx512::kNc;
  using gemm_avx512::kNr;
  // {M, N, K}: whole micro-tiles, one past them, k blocks (kKc) and B~ blocks (kNc) crossed,
  // a tall thin product like the backward of the LM head, and a wide one like its forward.
  const int64_t shapes[][3] = {{200, 200, 300},
                               {2 * kMr, 2 * kNr, kKc},
                               {2 * kMr + 1, 2 * kNr + 1, kKc + 1},
                               {31, kNc + 45, 2 * kKc + 9},
                               {3100, 20, 24},
                               {9, 1500, 40}};
  uint32_t n = 100;
  for (const auto& s : shapes)
    for (int t = 0; t < 4; ++t) {
      Case c;
      c.ta = t & 1;
      c.tb = t & 2;
      c.M = s[0];
      c.N = s[1];
      c.K = s[2];
      c.alpha = t == 3 ? 0.25f : 1.0f;
      c.beta = t == 1 ? 1.0f : 0.0f;
      c.bias = t != 2;
      c.pad = t == 0 ? 0 : 3;
      check_case(c, n++);
    }
}

// Attention's calls: T x T x hs blocks of a (B*T, 3C) qkv matrix, lda = 3C.
TEST_P(GemmTest, StridedBlocksLikeAttention) {
  const int64_t T = 67, hs = 64, C3 = 3 * 192;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> qkv(static_cast<size_t>(T * C3));
  for (auto& x : qkv) x = u(rng);
  std::vector<float> S(static_cast<size_t>(T * 80), kNaN);
  const float* q = qkv.data();
  const float* k = qkv.data() + 192;
  sgemm(false, true, T, T, hs, 0.125f, q, C3, k, C3, 0.0f, S.data(), 80);
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < 80; ++j) {
      if (j >= T) {
        EXPECT_TRUE(std::isnan(S[i * 80 + j]));
        continue;
      }
      double want = 0.0, mag = 0.0;
      for (int64_t c = 0; c < hs; ++c) {
        want += static_cast<double>(q[i * C3 + c]) * k[j * C3 + c];
        mag += std::fabs(static_cast<double>(q[i * C3 + c]) * k[j * C3 + c]);
      }
      EXPECT_NEAR(S[i * 80 + j], 0.125 * want, 2.0 * (hs + 3) * 0x1p-24 * 0.125 * mag)
          << i << "," << j;
    }
}

TEST_P(GemmTest, ZeroKScalesCAndAddsBias) {
  for (float beta : {0.0f, 1.0f, 0.5f})
    for (bool bias : {false, true}) {
      Case c;
      c.M = 5;
      c.N = 37;
      c.K = 0;
      c.beta = beta;
      c.bias = bias;
      c.pad = 2;
      check_case(c, 1);
    }
}

TEST_P(GemmTest, ZeroAlphaDoesNotReadAOrB) {
  Case c;
  c.M = 20;
  c.N = 40;
  c.K = 30;
  c.alpha = 0.0f;
  c.beta = -1.5f;
  c.bias = true;
  Operands op(c, 3);
  const Operands before = op;
  std::fill(op.A.begin(), op.A.end(), kNaN);
  std::fill(op.B.begin(), op.B.end(), kNaN);
  run(c, op);
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = 0; j < c.N; ++j) {
      // beta * C + bias: two roundings (or one, if the compiler fuses them).
      const double old = -1.5 * before.C[i * op.ldc + j];
      EXPECT_NEAR(op.C[i * op.ldc + j], old + before.bias[j],
                  2 * 0x1p-24 * (std::fabs(old) + std::fabs(before.bias[j])))
          << i << "," << j;
    }
}

TEST_P(GemmTest, EmptyProductsLeaveCAlone) {
  float c = 42.0f;
  sgemm(false, false, 0, 5, 3, 1.0f, nullptr, 3, nullptr, 5, 0.0f, &c, 5);
  sgemm(true, true, 4, 0, 3, 1.0f, nullptr, 4, nullptr, 3, 0.0f, &c, 1);
  EXPECT_EQ(c, 42.0f);
}

INSTANTIATE_TEST_SUITE_P(Impl, GemmTest, ::testing::Values(GemmImpl::kAvx512, GemmImpl::kBlas),
                         [](const auto& info) { return std::string(gemm_impl_name(info.param)); });

// ---- the AVX-512 engine's bit-for-bit determinism --------------------------------------------

class GemmAvx512Determinism : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_threads_ = omp_get_max_threads();
    if (!cpu_info().avx512f) GTEST_SKIP() << "no AVX-512F on this CPU";
    set_gemm_impl(GemmImpl::kAvx512);
  }
  void TearDown() override {
    set_gemm_impl(GemmImpl::kAuto);
    omp_set_num_threads(saved_threads_);
  }
  int saved_threads_ = 1;
};

TEST_F(GemmAvx512Determinism, SameBitsForAnyThreadCountAndInsideParallelRegions) {
  // Shapes split differently by 1, 2 and 3 threads (rows or columns), with several k blocks.
  const int64_t shapes[][3] = {{300, 700, 900}, {1000, 96, 500}, {45, 2000, 130}};
  for (const auto& s : shapes)
    for (int t = 0; t < 4; ++t) {
      Case c;
      c.ta = t & 1;
      c.tb = t & 2;
      c.M = s[0];
      c.N = s[1];
      c.K = s[2];
      c.beta = t == 1 ? 1.0f : 0.0f;
      c.bias = true;
      const Operands init(c, 11);
      Operands one = init;
      omp_set_num_threads(1);
      run(c, one);
      for (int threads : {2, 3}) {
        Operands many = init;
        omp_set_num_threads(threads);
        run(c, many);
        EXPECT_EQ(0, std::memcmp(one.C.data(), many.C.data(), one.C.size() * sizeof(float)))
            << c.str() << " threads=" << threads;
      }
      // Inside a parallel region every thread runs its own product on the calling thread.
      omp_set_num_threads(2);
      std::vector<Operands> each(2, init);
      std::vector<int> team_size(2, 0);
#pragma omp parallel num_threads(2)
      {
        const int me = omp_get_thread_num();
        team_size[me] = omp_get_num_threads();
        run(c, each[me]);
      }
      for (int me = 0; me < 2; ++me) {
        if (team_size[0] == 2 || me == 0) {
          EXPECT_EQ(0, std::memcmp(one.C.data(), each[me].C.data(), one.C.size() * sizeof(float)))
              << c.str() << " in parallel region, thread " << me;
        }
      }
    }
}

// ---- selecting the implementation -----------------------------------------------------------

TEST(GemmImpl, AutoPicksAvx512ExactlyWhenTheCpuHasIt) {
  set_gemm_impl(GemmImpl::kAuto);
  EXPECT_EQ(gemm_impl(), cpu_info().avx512f ? GemmImpl::kAvx512 : GemmImpl::kBlas);
  set_gemm_impl(GemmImpl::kBlas);
  EXPECT_EQ(gemm_impl(), GemmImpl::kBlas);
  if (cpu_info().avx512f) {
    EXPECT_NO_THROW(set_gemm_impl(GemmImpl::kAvx512));
    EXPECT_EQ(gemm_impl(), GemmImpl::kAvx512);
  } else {
    EXPECT_THROW(set_gemm_impl(GemmImpl::kAvx512), InputError);
    EXPECT_EQ(gemm_impl(), GemmImpl::kBlas);  // unchanged by the failed request
  }
  set_gemm_impl(GemmImpl::kAuto);
  EXPECT_STREQ(gemm_impl_name(GemmImpl::kAvx512), "avx512");
  EXPECT_STREQ(gemm_impl_name(GemmImpl::kBlas), "openblas");
  EXPECT_STREQ(gemm_impl_name(GemmImpl::kAuto), "auto");
}

TEST(GemmImpl, RejectsBadSizesAndLeadingDimensions) {
  float x[4] = {};
  EXPECT_THROW(sgemm(false, false, -1, 1, 1, 1.0f, x, 1, x, 1, 0.0f, x, 1), Error);
  EXPECT_THROW(sgemm(false, false, 2, 2, 2, 1.0f, x, 1, x, 2, 0.0f, x, 2), Error);  // lda < K
  EXPECT_THROW(sgemm(false, true, 2, 2, 2, 1.0f, x, 2, x, 1, 0.0f, x, 2), Error);   // ldb < K
  EXPECT_THROW(sgemm(false, false, 2, 2, 2, 1.0f, x, 2, x, 2, 0.0f, x, 1), Error);  // ldc < N
}

}  // namespace
}  // namespace zerod::cpu
