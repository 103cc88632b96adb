// The CUDA casts against the CPU reference (core/dtype.h), bit for bit. Skips without a GPU.
#include "kernels/cuda/cast.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"

namespace zerod {
namespace {

template <class T>
struct DeviceArray {
  T* p = nullptr;
  explicit DeviceArray(size_t n) {
    cuda::check(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T)), "cudaMalloc");
  }
  ~DeviceArray() { cudaFree(p); }
};

std::vector<float> test_values() {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          -1.5f,
                          65504.0f,
                          65520.0f,
                          0x1p-24f,
                          0x1p-25f,
                          1.0f + 0x1p-8f,
                          1.0f + 3 * 0x1p-8f,
                          std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::denorm_min()};
  Rng rng(3);
  for (int i = 0; i < 100000; ++i) {
    const uint32_t bits = static_cast<uint32_t>(rng.next_u64());
    float f;
    std::memcpy(&f, &bits, 4);
    v.push_back(f);
  }
  return v;
}

TEST(CudaCast, MatchesTheCpuConversionsBitForBit) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const std::vector<float> in = test_values();
  const size_t n = in.size();
  DeviceArray<float> d_in(n), d_back(n);
  DeviceArray<uint16_t> d_half(n);
  cuda::check(cudaMemcpy(d_in.p, in.data(), n * 4, cudaMemcpyHostToDevice), "copy in");
  std::vector<uint16_t> bits(n);
  std::vector<float> back(n);
  for (DType t : {DType::kBF16, DType::kF16}) {
    std::fill(bits.begin(), bits.end(), 0xFFFF);  // poisoned before the run
    if (t == DType::kBF16) {
      cuda::cast_f32_to_bf16(d_half.p, d_in.p, static_cast<int64_t>(n));
      cuda::cast_bf16_to_f32(d_back.p, d_half.p, static_cast<int64_t>(n));
    } else {
      cuda::cast_f32_to_f16(d_half.p, d_in.p, static_cast<int64_t>(n));
      cuda::cast_f16_to_f32(d_back.p, d_half.p, static_cast<int64_t>(n));
    }
    cuda::check(cudaMemcpy(bits.data(), d_half.p, n * 2, cudaMemcpyDeviceToHost), "copy bits");
    cuda::check(cudaMemcpy(back.data(), d_back.p, n * 4, cudaMemcpyDeviceToHost), "copy back");
    for (size_t i = 0; i < n; ++i) {
      const float want = t == DType::kBF16 ? round_bf16(in[i]) : round_f16(in[i]);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(back[i])) << i;
        continue;
      }
      const uint16_t want_bits =
          t == DType::kBF16 ? f32_to_bf16_bits(in[i]) : f32_to_f16_bits(in[i]);
      ASSERT_EQ(bits[i], want_bits) << dtype_name(t) << " of " << in[i];
      ASSERT_EQ(back[i], want) << dtype_name(t) << " of " << in[i];
    }
  }
}

TEST(CudaCast, DeviceCountNeverThrows) {
  EXPECT_GE(cuda::device_count(), 0);
}

}  // namespace
}  // namespace zerod
