#include "core/crc32c.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace zerod {
namespace {

// A bit-at-a-time CRC32C straight from the definition (reflected 0x1EDC6F41, init and final
// xor 0xFFFFFFFF): the reference both fast paths are held to.
uint32_t crc32c_bitwise(const uint8_t* p, size_t n) {
  uint32_t r = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    r ^= p[i];
    for (int b = 0; b < 8; ++b) r = (r >> 1) ^ ((r & 1u) ? 0x82F63B78u : 0u);
  }
  return ~r;
}

uint32_t crc_of(const std::string& s) {
  return crc32c(s.data(), s.size());
}

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(gen());
  return v;
}

TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(crc_of(""), 0u);
  EXPECT_EQ(crc_of("123456789"), 0xE3069283u);  // the catalogue's check value
  EXPECT_EQ(crc_of("a"), 0xC1D04330u);
  // RFC 3720 (iSCSI) appendix B.4 test patterns, 32 bytes each.
  std::vector<uint8_t> v(32, 0);
  EXPECT_EQ(crc32c(v.data(), v.size()), 0x8A9136AAu);
  std::fill(v.begin(), v.end(), 0xFF);
  EXPECT_EQ(crc32c(v.data(), v.size()), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) v[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(crc32c(v.data(), v.size()), 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) v[i] = static_cast<uint8_t>(31 - i);
  EXPECT_EQ(crc32c(v.data(), v.size()), 0x113FDB5Cu);
  // The table path gives the same answers.
  EXPECT_EQ(crc32c_table("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c_table(v.data(), v.size()), 0x113FDB5Cu);
}

TEST(Crc32c, MatchesTheBitwiseDefinition) {
  // Lengths around every block boundary of the fast paths (8-byte words, 3 x 256, 3 x 8192).
  const std::vector<uint8_t> data = random_bytes(3 * 8192 * 2 + 3 * 256 + 64, 1);
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{767}, size_t{768},
                   size_t{769}, size_t{24575}, size_t{24576}, size_t{24577}, data.size()}) {
    const uint32_t want = crc32c_bitwise(data.data(), n);
    EXPECT_EQ(crc32c(data.data(), n), want) << n;
    EXPECT_EQ(crc32c_table(data.data(), n), want) << n;
    if (crc32c_has_sse42()) {
      EXPECT_EQ(crc32c_sse42(data.data(), n), want) << n;
    }
  }
}

TEST(Crc32c, IncrementalEqualsOneShot) {
  const std::vector<uint8_t> data = random_bytes(200000, 2);
  const uint32_t whole = crc32c(data.data(), data.size());
  std::mt19937 gen(3);
  for (int trial = 0; trial < 50; ++trial) {
    // Split into a random number of random-length pieces (including empty ones).
    uint32_t crc = 0, crc_table = 0;
    size_t pos = 0;
    while (pos < data.size()) {
      size_t len = gen() % (trial % 2 ? 40000 : 300);
      len = std::min(len, data.size() - pos);
      crc = crc32c(data.data() + pos, len, crc);
      crc_table = crc32c_table(data.data() + pos, len, crc_table);
      pos += len;
    }
    ASSERT_EQ(crc, whole) << "trial " << trial;
    ASSERT_EQ(crc_table, whole) << "trial " << trial;
  }
}

TEST(Crc32c, HardwareEqualsTableOnOddLengthsAndAlignments) {
  if (!crc32c_has_sse42()) GTEST_SKIP() << "this CPU has no SSE4.2";
  const std::vector<uint8_t> data = random_bytes(100000, 4);
  std::mt19937 gen(5);
  for (int trial = 0; trial < 400; ++trial) {
    const size_t offset = gen() % 64;
    const size_t max_len = data.size() - offset;
    const size_t len = trial < 200 ? gen() % 2000 : gen() % max_len;
    const uint32_t seed = trial % 3 == 0 ? 0u : static_cast<uint32_t>(gen());
    ASSERT_EQ(crc32c_sse42(data.data() + offset, len, seed),
              crc32c_table(data.data() + offset, len, seed))
        << "offset " << offset << " length " << len;
  }
}

TEST(Crc32c, DetectsSingleBitFlips) {
  std::vector<uint8_t> data = random_bytes(30000, 6);
  const uint32_t base = crc32c(data.data(), data.size());
  for (size_t pos : {size_t{0}, size_t{777}, size_t{8193}, size_t{29999}}) {
    data[pos] ^= 0x10;
    EXPECT_NE(crc32c(data.data(), data.size()), base) << pos;
    data[pos] ^= 0x10;
  }
  EXPECT_EQ(crc32c(data.data(), data.size()), base);
}

}  // namespace
}  // namespace zerod
