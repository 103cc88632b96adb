#include "engine/tokenizer/byte_level.h"

#include <array>
#include <cstdint>

#include "engine/tokenizer/utf8.h"

namespace zerod::tokenizer {
namespace {

struct Tables {
  std::array<std::string, 256> to_char;
  std::array<int16_t, 512> to_byte;  // every mapped code point is below U+0200
  Tables() {
    to_byte.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const uint32_t cp = printable ? static_cast<uint32_t>(b) : 256u + n++;
      utf8_append(to_char[b], cp);
      to_byte[cp] = static_cast<int16_t>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

void bytes_to_unicode(std::string_view bytes, std::string& out) {
  const Tables& t = tables();
  for (char c : bytes) out += t.to_char[static_cast<unsigned char>(c)];
}

int unicode_to_byte(uint32_t cp) { return cp < 512 ? tables().to_byte[cp] : -1; }

}  // namespace zerod::tokenizer
