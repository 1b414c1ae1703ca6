#include "model/byte_level.h"

#include <array>

#include "model/utf8.h"

namespace strata {

namespace {

bool keeps_own_value(uint8_t b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; }

struct ByteTable {
  std::array<char32_t, 256> to_unicode{};
  std::array<int16_t, 0x144> to_byte{};  // code points 0..U+0143 cover the whole alphabet; -1 = not a symbol

  ByteTable() {
    to_byte.fill(-1);
    char32_t next_shifted = 0x100;
    for (int b = 0; b < 256; ++b) {
      const auto byte = static_cast<uint8_t>(b);
      to_unicode[b] = keeps_own_value(byte) ? byte : next_shifted++;
      to_byte[to_unicode[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteTable& table() {
  static const ByteTable instance;
  return instance;
}

}  // namespace

char32_t byte_to_unicode(uint8_t byte) { return table().to_unicode[byte]; }

std::optional<uint8_t> unicode_to_byte(char32_t code_point) {
  if (code_point >= table().to_byte.size() || table().to_byte[code_point] < 0) return std::nullopt;
  return static_cast<uint8_t>(table().to_byte[code_point]);
}

std::string byte_level_encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) append_utf8(out, byte_to_unicode(static_cast<uint8_t>(c)));
  return out;
}

std::string byte_level_decode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const Utf8Char c = next_utf8_char(text.substr(pos));
    const std::optional<uint8_t> byte = c.valid ? unicode_to_byte(c.code_point) : std::nullopt;
    if (byte) {
      out.push_back(static_cast<char>(*byte));
    } else {
      out.append(text.substr(pos, c.n_bytes));
    }
    pos += c.n_bytes;
  }
  return out;
}

}  // namespace strata
