#pragma once
// The GPT-2 byte-level alphabet (bytes_to_unicode): every byte gets a printable code point, so that BPE tokens
// never contain spaces or control characters. Bytes 0x21-0x7E, 0xA1-0xAC and 0xAE-0xFF keep their own value;
// the other 68 bytes, in increasing order, map to U+0100..U+0143 (space -> U+0120 'Ġ', '\n' -> U+010A 'Ċ').
// ../shared/specs/model_format.md, section 6.3.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace strata {

char32_t byte_to_unicode(uint8_t byte);
std::optional<uint8_t> unicode_to_byte(char32_t code_point);  // nullopt outside the 256-symbol alphabet

// Each byte of the input becomes its symbol, written as UTF-8.
std::string byte_level_encode(std::string_view bytes);
// The inverse. A character outside the alphabet is kept as its own UTF-8 bytes (as HF's ByteLevel decoder does);
// ill-formed UTF-8 in the input is kept byte for byte.
std::string byte_level_decode(std::string_view text);

}  // namespace strata
