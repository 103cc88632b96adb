// Fused causal attention of the CUDA backend against the CPU reference (metric and limits:
// cuda_test_util.h), through both implementations: the tensor-core kernels (bf16/fp16, head
// sizes 32/64/128) and the SIMT ones. Skips without a GPU.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "cuda_test_util.h"
#include "kernels/cuda/attention.h"

namespace zerod {
namespace {

using test::Backends;
using test::VecF;

struct Shape {
  int B, T, C, NH;
};
// Head sizes 16, 64, 80 and 256 (1, 2, 4 (partly used) and 8 channels per lane, the last past
// 48 KiB of shared memory); T not a multiple of the 32-row tiles, and a single position. For the
// tensor-core kernels (64-row tiles): head sizes 32, 64 and 128, T across several tiles and not a
// multiple of 64.
constexpr Shape kShapes[] = {{2, 67, 48, 3},   {2, 100, 128, 2}, {1, 45, 160, 2},
                             {1, 40, 256, 1},  {3, 1, 64, 4},    {2, 130, 96, 3},
                             {1, 193, 256, 2}, {1, 64, 128, 4},  {2, 7, 384, 3}};

std::string label(DType dt, const Shape& s) {
  return std::string(dtype_name(dt)) + " B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
         " C=" + std::to_string(s.C) + " NH=" + std::to_string(s.NH) +
         (cuda::attention_impl() == cuda::AttentionImpl::kSimt ? " simt" : " auto");
}

// Runs the test body under each implementation, restoring the automatic choice after.
class CudaAttention : public ::testing::TestWithParam<cuda::AttentionImpl> {
 protected:
  void SetUp() override { cuda::set_attention_impl(GetParam()); }
  void TearDown() override { cuda::set_attention_impl(cuda::AttentionImpl::kAuto); }
};

TEST_P(CudaAttention, ForwardMatchesTheCpuOutputAndLse) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  for (DType dt : test::kAllDtypes) {
    for (const Shape& s : kShapes) {
      SCOPED_TRACE(label(dt, s));
      Backends be(dt);
      const int64_t BT = int64_t{s.B} * s.T;
      const VecF qkv = be.round(test::randn(BT * 3 * s.C, 90, 1.5f));
      VecF out(BT * s.C), lse(int64_t{s.B} * s.NH * s.T);
      be.cpu->attention_forward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH);
      Buffer d_qkv = be.compute(qkv);
      Buffer d_out = be.poisoned_compute(BT * s.C);
      Buffer d_lse = be.poisoned_f32(static_cast<int64_t>(lse.size()));
      be.gpu->attention_forward(d_out.data(), d_lse.as<float>(), d_qkv.data(), s.B, s.T, s.C, s.NH);
      EXPECT_TRUE(test::close(be.read_compute(d_out, BT * s.C), out, test::tolerance(dt)));
      // lse is fp32 on both sides, from identical inputs.
      EXPECT_TRUE(test::close(be.read_f32(d_lse, static_cast<int64_t>(lse.size())), lse, 1e-5));
    }
  }
}

TEST_P(CudaAttention, BackwardMatchesTheCpu) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  for (DType dt : test::kAllDtypes) {
    for (const Shape& s : kShapes) {
      SCOPED_TRACE(label(dt, s));
      Backends be(dt);
      const int64_t BT = int64_t{s.B} * s.T;
      const VecF qkv = be.round(test::randn(BT * 3 * s.C, 100, 1.5f));
      const VecF dout = be.round(test::randn(BT * s.C, 101));
      VecF out(BT * s.C), lse(int64_t{s.B} * s.NH * s.T);
      be.cpu->attention_forward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH);
      out = be.round(out);  // the stored forward output both backward passes read
      VecF dqkv(BT * 3 * s.C);
      be.cpu->attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.B,
                                 s.T, s.C, s.NH);
      Buffer d_qkv = be.compute(qkv), d_dout = be.compute(dout), d_out = be.compute(out);
      Buffer d_lse = be.f32(lse);
      Buffer d_dqkv = be.poisoned_compute(BT * 3 * s.C);
      be.gpu->attention_backward(d_dqkv.data(), d_dout.data(), d_qkv.data(), d_out.data(),
                                 d_lse.as<float>(), s.B, s.T, s.C, s.NH);
      EXPECT_TRUE(test::close(be.read_compute(d_dqkv, BT * 3 * s.C), dqkv, test::tolerance(dt)));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Impl, CudaAttention,
                         ::testing::Values(cuda::AttentionImpl::kAuto, cuda::AttentionImpl::kSimt),
                         [](const auto& info) {
                           return info.param == cuda::AttentionImpl::kSimt ? "simt" : "auto";
                         });

TEST(CudaAttentionHeads, RejectsHeadSizesItCannotRun) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  auto be = make_cuda_backend(DType::kBF16);
  EXPECT_THROW(be->attention_forward(nullptr, nullptr, nullptr, 1, 4, 512, 1), Error);
  EXPECT_THROW(be->attention_forward(nullptr, nullptr, nullptr, 1, 4, 50, 3), Error);
}

}  // namespace
}  // namespace zerod
