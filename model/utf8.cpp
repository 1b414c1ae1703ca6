#include "model/utf8.h"

namespace strata {

namespace {

// The well-formed range of the second byte after a given lead byte (Unicode table 3-7); later continuation
// bytes are always 0x80-0xBF. Returns false for a byte that cannot start a sequence.
bool lead_byte_info(uint8_t lead, size_t& length, uint8_t& second_lo, uint8_t& second_hi) {
  second_lo = 0x80;
  second_hi = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) second_lo = 0xA0;  // no overlong forms
    if (lead == 0xED) second_hi = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) second_lo = 0x90;
    if (lead == 0xF4) second_hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return false;
  }
  return true;
}

// How many bytes from the front form a well-formed (possibly incomplete) prefix of one character, and the
// length the full character needs. n_ok == 0 means the first byte is not a valid lead byte.
struct Prefix {
  size_t n_ok = 0;
  size_t length = 0;
};

Prefix well_formed_prefix(std::string_view bytes) {
  const auto lead = static_cast<uint8_t>(bytes[0]);
  if (lead < 0x80) return {1, 1};
  size_t length = 0;
  uint8_t lo = 0, hi = 0;
  if (!lead_byte_info(lead, length, lo, hi)) return {0, 1};
  size_t n_ok = 1;
  while (n_ok < length && n_ok < bytes.size()) {
    const auto b = static_cast<uint8_t>(bytes[n_ok]);
    if (b < lo || b > hi) break;
    lo = 0x80;
    hi = 0xBF;
    ++n_ok;
  }
  return {n_ok, length};
}

}  // namespace

Utf8Char next_utf8_char(std::string_view bytes) {
  if (bytes.empty()) return {};
  const Prefix prefix = well_formed_prefix(bytes);
  if (prefix.n_ok == 0) return {kReplacementChar, 1, false};
  if (prefix.n_ok < prefix.length) return {kReplacementChar, prefix.n_ok, false};
  const auto lead = static_cast<uint8_t>(bytes[0]);
  static constexpr uint8_t kLeadMask[4] = {0x7F, 0x1F, 0x0F, 0x07};  // payload bits of a 1-, 2-, 3-, 4-byte lead
  char32_t cp = lead & kLeadMask[prefix.length - 1];
  for (size_t i = 1; i < prefix.length; ++i) cp = (cp << 6) | (static_cast<uint8_t>(bytes[i]) & 0x3F);
  return {cp, prefix.length, true};
}

size_t complete_utf8_prefix_length(std::string_view bytes) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    const Prefix prefix = well_formed_prefix(bytes.substr(pos));
    // Only a well-formed sequence cut short by the end of the input can still become a character.
    if (prefix.n_ok > 0 && prefix.n_ok < prefix.length && pos + prefix.n_ok == bytes.size()) return pos;
    pos += prefix.n_ok == 0 ? 1 : prefix.n_ok;
  }
  return pos;
}

std::string utf8_decode_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    const Utf8Char c = next_utf8_char(bytes.substr(pos));
    if (c.valid) {
      out.append(bytes.substr(pos, c.n_bytes));
    } else {
      append_utf8(out, kReplacementChar);
    }
    pos += c.n_bytes;
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace strata
