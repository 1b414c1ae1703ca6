#pragma once
// UTF-8 helpers for tokenization and streaming detokenization (../shared/specs/model_format.md, section 6.7).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace strata {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// One decoding step: the code point at the front of the input and how many bytes it used. An ill-formed
// sequence yields valid = false and n_bytes = the length of its maximal subpart (at least 1), the unit that
// lossy decoding turns into one U+FFFD.
struct Utf8Char {
  char32_t code_point = 0;  // kReplacementChar when !valid
  size_t n_bytes = 0;
  bool valid = false;
};
Utf8Char next_utf8_char(std::string_view bytes);

// Length of the longest prefix that does not end in the middle of a character: an incomplete but so far
// well-formed sequence at the end (at most 3 bytes) is held back; ill-formed bytes count as complete, since no
// later byte can repair them.
size_t complete_utf8_prefix_length(std::string_view bytes);

// Bytes to valid UTF-8; each maximal ill-formed subpart becomes one U+FFFD, as Rust's String::from_utf8_lossy
// (and so Hugging Face tokenizers) does.
std::string utf8_decode_lossy(std::string_view bytes);

void append_utf8(std::string& out, char32_t code_point);

}  // namespace strata
