// The CUDA backend's memory, copy and precision ops. Skips without a GPU (except the factory's
// refusal, which needs none).
#include "kernels/cuda/cuda_backend.h"

#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "cuda_test_util.h"

namespace zerod {
namespace {

using test::Backends;
using test::VecF;

TEST(CudaBackend, FactoryRefusesAMissingDevice) {
  EXPECT_THROW(make_cuda_backend(DType::kF32, cuda::device_count()), Error);
  EXPECT_THROW(make_cuda_backend(DType::kF32, -1), Error);
}

TEST(CudaBackend, DescribesItself) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  for (DType dt : test::kAllDtypes) {
    auto be = make_cuda_backend(dt);
    EXPECT_STREQ(be->name(), "cuda");
    EXPECT_EQ(be->compute_dtype(), dt);
    EXPECT_EQ(be->compute_elem_size(), dt == DType::kF32 ? 4u : 2u);
  }
}

TEST(CudaBackend, AllocateChargesTheTrackerAndZeroes) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  auto be = make_cuda_backend(DType::kBF16);
  MemoryTracker tracker;
  {
    Buffer b = be->allocate(1000, MemCategory::kActivations, &tracker);
    EXPECT_EQ(tracker.current(MemCategory::kActivations), 1000);
    std::vector<unsigned char> host(1000, 0xAB);
    be->copy(host.data(), b.data(), host.size());
    for (int i = 0; i < 1000; ++i) ASSERT_EQ(host[i], 0) << i;
    Buffer empty = be->allocate(0, MemCategory::kWorkspace, &tracker);
    EXPECT_TRUE(empty.empty());
  }
  EXPECT_EQ(tracker.current(MemCategory::kActivations), 0);
}

TEST(CudaBackend, CopyAndMemsetBetweenHostAndDevice) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  auto be = make_cuda_backend(DType::kF32);
  const VecF x = test::randn(4097, 1);
  const size_t bytes = x.size() * sizeof(float);
  Buffer a = be->allocate(bytes, MemCategory::kActivations, nullptr);
  Buffer b = be->allocate(bytes, MemCategory::kActivations, nullptr);
  be->copy(a.data(), x.data(), bytes);  // host -> device
  be->copy(b.data(), a.data(), bytes);  // device -> device
  VecF back(x.size(), -1.0f);
  be->copy(back.data(), b.data(), bytes);  // device -> host, complete on return
  EXPECT_EQ(std::memcmp(back.data(), x.data(), bytes), 0);
  be->memset_zero(b.as<char>() + 16, bytes - 32);
  be->copy(back.data(), b.data(), bytes);
  for (size_t i = 0; i < x.size(); ++i) {
    const bool kept = i < 4 || i >= x.size() - 4;
    ASSERT_EQ(back[i], kept ? x[i] : 0.0f) << i;
  }
}

TEST(CudaBackend, CastsRoundLikeTheCpuFromHostAndDeviceMemory) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  VecF x = test::randn(10001, 2, 100.0f);
  x[0] = 70000.0f;  // fp16 overflow to infinity
  x[1] = 1e-6f;     // fp16 subnormal
  for (DType dt : test::kAllDtypes) {
    Backends be(dt);
    const VecF want = be.round(x);
    const int64_t n = static_cast<int64_t>(x.size());
    // Host fp32 -> device compute -> host fp32.
    Buffer c = be.compute(x);
    VecF got = be.read_compute(c, n);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), x.size() * 4), 0) << dtype_name(dt);
    // Device fp32 -> device compute -> device fp32.
    Buffer f = be.f32(x);
    Buffer c2 = be.poisoned_compute(n);
    be.gpu->cast_to_compute(c2.data(), f.as<float>(), n);
    Buffer f2 = be.poisoned_f32(n);
    be.gpu->cast_from_compute(f2.as<float>(), c2.data(), n);
    got = be.read_f32(f2, n);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), x.size() * 4), 0) << dtype_name(dt);
    // round_to_compute is a no-op on real 16-bit storage.
    be.gpu->round_to_compute(c2.data(), n);
    got = be.read_compute(c2, n);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), x.size() * 4), 0) << dtype_name(dt);
  }
}

}  // namespace
}  // namespace zerod
