#include "core/rng.h"

#include <cmath>
#include <numbers>

namespace zerod {

std::array<uint32_t, 4> philox4x32(uint64_t key, uint64_t counter_hi, uint64_t counter_lo) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(counter_lo), c1 = static_cast<uint32_t>(counter_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(counter_hi), c3 = static_cast<uint32_t>(counter_hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return {c0, c1, c2, c3};
}

namespace {
// (0, 1]: never 0, so log() is finite.
inline double to_open01(uint32_t hi, uint32_t lo) {
  const uint64_t bits = ((static_cast<uint64_t>(hi) << 32) | lo) >> 11;
  return (static_cast<double>(bits) + 1.0) * 0x1.0p-53;
}
}  // namespace

void fill_normal(float* out, int64_t n, float mean, float stddev, uint64_t seed, uint64_t stream,
                 int64_t offset) {
  // Each Philox block yields 2 standard normals (Box-Muller on 2 doubles of 64 bits each);
  // element e uses block e/2, output e%2.
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t e = static_cast<uint64_t>(offset + i);
    const auto r = philox4x32(seed, stream, e >> 1);
    const double u1 = to_open01(r[0], r[1]);
    const double u2 = to_open01(r[2], r[3]);
    const double radius = std::sqrt(-2.0 * std::log(u1));
    const double angle = 2.0 * std::numbers::pi * u2;
    const double z = (e & 1) ? radius * std::sin(angle) : radius * std::cos(angle);
    out[i] = static_cast<float>(mean + stddev * z);
  }
}

uint64_t Rng::next_u64() {
  const auto r = philox4x32(state_.seed, state_.stream, state_.counter++);
  return (static_cast<uint64_t>(r[0]) << 32) | r[1];
}

uint64_t Rng::uniform(uint64_t bound) {
  // Lemire-style rejection on the 64-bit range.
  const uint64_t limit = UINT64_MAX - (UINT64_MAX % bound);
  uint64_t x;
  do {
    x = next_u64();
  } while (x >= limit);
  return x % bound;
}

}  // namespace zerod
