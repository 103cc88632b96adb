#include "kernels/cpu/cast.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

#include "core/dtype.h"
#include "core/rng.h"
#include "kernel_test_util.h"

namespace zerod::cpu {
namespace {

using test::VecF;

// Floats that stress both conversions: signed zeros, infinities, NaNs with payloads and signs,
// fp32 subnormals, the fp16 subnormal range and its boundaries, fp16 overflow boundaries, exact
// ties of both formats, then every upper-19-bit pattern with tie/near-tie low bits, then random
// bit patterns.
VecF special_floats() {
  std::vector<uint32_t> bits = {
      0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u, 0x7f800001u,
      0xff800001u, 0x7fbfffffu, 0x7fffffffu, 0x00000001u, 0x807fffffu, 0x00400000u, 0x33000000u,
      0x33000001u, 0x32ffffffu, 0xb3000000u, 0x33800000u, 0x387fc000u, 0x387fe000u, 0x387fffffu,
      0x38800000u, 0xb8800000u, 0x477fe000u, 0x477fefffu, 0x477ff000u, 0xc77ff000u, 0x47800000u,
      0x7f7fffffu, 0x3f808000u, 0x3f818000u, 0x3f800fffu, 0x3f801000u, 0x3f803000u};
  for (uint32_t hi = 0; hi < (1u << 19); ++hi)
    for (uint32_t lo : {0x0u, 0x1000u, 0xfffu, 0x1001u, 0x1fffu}) bits.push_back((hi << 13) | lo);
  for (uint32_t hi = 0; hi < (1u << 16); hi += 7)  // bf16 ties and near-ties
    for (uint32_t lo : {0x8000u, 0x7fffu, 0x8001u}) bits.push_back((hi << 16) | lo);
  Rng rng(900);
  for (int i = 0; i < 200000; ++i) bits.push_back(static_cast<uint32_t>(rng.next_u64()));
  // fp16 subnormal range (|x| < 2^-14) sampled densely.
  for (int i = 0; i < 100000; ++i)
    bits.push_back((0x33000000u + static_cast<uint32_t>(rng.uniform(0x38800000u - 0x33000000u))) |
                   (i & 1 ? 0x80000000u : 0u));
  VecF out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = std::bit_cast<float>(bits[i]);
  return out;
}

void expect_bits_equal(const VecF& got, const VecF& in, float (*scalar)(float), const char* name) {
  int64_t mismatches = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const uint32_t want = std::bit_cast<uint32_t>(scalar(in[i]));
    const uint32_t have = std::bit_cast<uint32_t>(got[i]);
    if (want != have && ++mismatches <= 5) {
      ADD_FAILURE() << name << " of 0x" << std::hex << std::bit_cast<uint32_t>(in[i]) << ": got 0x"
                    << have << ", want 0x" << want;
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(Cast, Bf16RoundingEqualsScalarConversionBitwise) {
  const VecF in = special_floats();
  VecF x = in;
  round_bf16_inplace(x.data(), static_cast<int64_t>(x.size()));
  expect_bits_equal(x, in, round_bf16, "bf16");
  VecF y(in.size());
  cast_round(y.data(), in.data(), static_cast<int64_t>(in.size()), DType::kBF16);
  EXPECT_TRUE(test::bitwise_equal(x, y));
}

TEST(Cast, F16RoundingEqualsScalarConversionBitwise) {
  const VecF in = special_floats();
  VecF x = in;
  round_f16_inplace(x.data(), static_cast<int64_t>(x.size()));
  expect_bits_equal(x, in, round_f16, "fp16");
  VecF y(in.size());
  cast_round(y.data(), in.data(), static_cast<int64_t>(in.size()), DType::kF16);
  EXPECT_TRUE(test::bitwise_equal(x, y));
  // Spot checks that do not lean on the scalar reference.
  EXPECT_EQ(x[2], INFINITY);                              // inf stays inf
  EXPECT_TRUE(std::isnan(x[6]) && std::isnan(x[7]));      // signalling NaNs become NaNs
  EXPECT_EQ(std::bit_cast<uint32_t>(x[1]), 0x80000000u);  // -0 keeps its sign
}

TEST(Cast, F32IsACopy) {
  const VecF in = test::randn(1000, 910);
  VecF out(in.size(), test::kNaN);
  cast_round(out.data(), in.data(), 1000, DType::kF32);
  EXPECT_TRUE(test::bitwise_equal(in, out));
}

}  // namespace
}  // namespace zerod::cpu
