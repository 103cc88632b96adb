#include "core/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#define ZEROD_CRC32C_X86 1
#endif

namespace zerod {

namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // 0x1EDC6F41 bit-reversed

// Slicing-by-8 tables: kTable[0] advances the register by one byte; kTable[k] by a byte
// followed by k zero bytes.
using Tables = std::array<std::array<uint32_t, 256>, 8>;
constexpr Tables make_tables() {
  Tables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t r = b;
    for (int i = 0; i < 8; ++i) r = (r >> 1) ^ ((r & 1u) ? kPoly : 0u);
    t[0][b] = r;
  }
  for (int k = 1; k < 8; ++k)
    for (uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xffu];
  return t;
}
constexpr Tables kTable = make_tables();

inline uint32_t load32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;  // x86 and every target we build for are little-endian
}
inline uint64_t load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// Advances the raw register (no pre/post inversion) over n bytes with the tables.
uint32_t table_update(uint32_t r, const uint8_t* p, size_t n) {
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7u) != 0) {
    r = (r >> 8) ^ kTable[0][(r ^ *p++) & 0xffu];
    --n;
  }
  for (; n >= 8; n -= 8, p += 8) {
    const uint32_t lo = r ^ load32(p), hi = load32(p + 4);
    r = kTable[7][lo & 0xffu] ^ kTable[6][(lo >> 8) & 0xffu] ^ kTable[5][(lo >> 16) & 0xffu] ^
        kTable[4][lo >> 24] ^ kTable[3][hi & 0xffu] ^ kTable[2][(hi >> 8) & 0xffu] ^
        kTable[1][(hi >> 16) & 0xffu] ^ kTable[0][hi >> 24];
  }
  while (n-- > 0) r = (r >> 8) ^ kTable[0][(r ^ *p++) & 0xffu];
  return r;
}

#if ZEROD_CRC32C_X86
// The hardware path splits the data into three equal streams, runs them through the crc32
// instruction side by side (it has a latency of 3 cycles and a throughput of 1 per cycle), then
// joins them: the register after A followed by B is zeros(len B)(register after A) ^ register of
// B from 0, where zeros(L) (appending L zero bytes) is linear in the register bits, so it is
// applied with four 256-entry tables built from its images of the 32 unit vectors.
constexpr size_t kLong = 8192;  // bytes per stream for long inputs
constexpr size_t kShort = 256;  // bytes per stream for the tail

struct ZerosOperator {
  std::array<std::array<uint32_t, 256>, 4> t{};
  explicit ZerosOperator(size_t len) {
    std::array<uint32_t, 32> image{};
    for (int bit = 0; bit < 32; ++bit) {
      uint32_t r = 1u << bit;
      for (size_t i = 0; i < len; ++i) r = (r >> 8) ^ kTable[0][r & 0xffu];
      image[bit] = r;
    }
    for (int k = 0; k < 4; ++k)
      for (uint32_t b = 0; b < 256; ++b) {
        uint32_t v = 0;
        for (int bit = 0; bit < 8; ++bit)
          if (b & (1u << bit)) v ^= image[8 * k + bit];
        t[k][b] = v;
      }
  }
  uint32_t apply(uint32_t r) const {
    return t[0][r & 0xffu] ^ t[1][(r >> 8) & 0xffu] ^ t[2][(r >> 16) & 0xffu] ^ t[3][r >> 24];
  }
};

const ZerosOperator& zeros_long() {
  static const ZerosOperator op(kLong);
  return op;
}
const ZerosOperator& zeros_short() {
  static const ZerosOperator op(kShort);
  return op;
}

__attribute__((target("sse4.2"))) inline uint64_t three_streams(uint64_t c0, const uint8_t* p,
                                                                size_t len,
                                                                const ZerosOperator& zeros) {
  uint64_t c1 = 0, c2 = 0;
  const uint8_t* end = p + len;
  for (; p < end; p += 8) {
    c0 = _mm_crc32_u64(c0, load64(p));
    c1 = _mm_crc32_u64(c1, load64(p + len));
    c2 = _mm_crc32_u64(c2, load64(p + 2 * len));
  }
  c0 = zeros.apply(static_cast<uint32_t>(c0)) ^ c1;
  return zeros.apply(static_cast<uint32_t>(c0)) ^ c2;
}
#endif

}  // namespace

uint32_t crc32c_table(const void* data, size_t n, uint32_t crc) {
  return ~table_update(~crc, static_cast<const uint8_t*>(data), n);
}

#if ZEROD_CRC32C_X86
bool crc32c_has_sse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}

__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const void* data, size_t n, uint32_t crc) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint64_t c = static_cast<uint32_t>(~crc);
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7u) != 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --n;
  }
  if (n >= 3 * kLong) {
    const ZerosOperator& zeros = zeros_long();
    for (; n >= 3 * kLong; n -= 3 * kLong, p += 3 * kLong) c = three_streams(c, p, kLong, zeros);
  }
  if (n >= 3 * kShort) {
    const ZerosOperator& zeros = zeros_short();
    for (; n >= 3 * kShort; n -= 3 * kShort, p += 3 * kShort)
      c = three_streams(c, p, kShort, zeros);
  }
  for (; n >= 8; n -= 8, p += 8) c = _mm_crc32_u64(c, load64(p));
  while (n-- > 0) c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
  return ~static_cast<uint32_t>(c);
}
#else
bool crc32c_has_sse42() {
  return false;
}
uint32_t crc32c_sse42(const void* data, size_t n, uint32_t crc) {
  return crc32c_table(data, n, crc);
}
#endif

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  return crc32c_has_sse42() ? crc32c_sse42(data, n, crc) : crc32c_table(data, n, crc);
}

}  // namespace zerod
