#include "model/pretokenizer.h"

#include <array>
#include <stdexcept>
#include <string>

#include <unicode/uchar.h>

#include "model/utf8.h"

namespace strata {

namespace {

enum class CharClass : uint8_t { space, letter, number, other };

struct CharInfo {
  size_t offset;  // byte offset in the text
  char32_t code_point;
  CharClass cls;
};

CharClass classify(char32_t cp) {
  const auto c = static_cast<UChar32>(cp);
  if (u_isUWhiteSpace(c)) return CharClass::space;
  const uint32_t mask = U_GET_GC_MASK(c);
  if (mask & U_GC_L_MASK) return CharClass::letter;
  if (mask & U_GC_N_MASK) return CharClass::number;
  return CharClass::other;
}

std::vector<CharInfo> decode_chars(std::string_view text) {
  std::vector<CharInfo> chars;
  chars.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const Utf8Char c = next_utf8_char(text.substr(pos));
    if (c.valid) {
      chars.push_back({pos, c.code_point, classify(c.code_point)});
      pos += c.n_bytes;
    } else {
      // One character per ill-formed byte keeps every byte in some piece.
      chars.push_back({pos, kReplacementChar, CharClass::other});
      pos += 1;
    }
  }
  return chars;
}

// Length of a contraction ('s 't 're 've 'm 'll 'd, case-sensitive) starting at chars[i], or 0.
size_t contraction_length(const std::vector<CharInfo>& chars, size_t i, size_t end) {
  if (chars[i].code_point != U'\'' || i + 1 >= end) return 0;
  const char32_t a = chars[i + 1].code_point;
  if (a == U's' || a == U't' || a == U'm' || a == U'd') return 2;
  if (i + 2 >= end) return 0;
  const char32_t b = chars[i + 2].code_point;
  if ((a == U'r' && b == U'e') || (a == U'v' && b == U'e') || (a == U'l' && b == U'l')) return 3;
  return 0;
}

// The GPT-2 pattern over chars[begin, end): the alternatives are tried in order at each position, as a
// backtracking regex engine does, and the first that matches gives the piece.
void split_gpt2(const std::vector<CharInfo>& chars, size_t begin, size_t end, std::vector<std::pair<size_t, size_t>>& out) {
  size_t i = begin;
  while (i < end) {
    size_t length = contraction_length(chars, i, end);
    if (length == 0) {
      // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': an optional ASCII space, then a run of one class.
      const size_t start = chars[i].code_point == U' ' ? i + 1 : i;
      if (start < end && chars[start].cls != CharClass::space) {
        size_t j = start + 1;
        while (j < end && chars[j].cls == chars[start].cls) ++j;
        length = j - i;
      }
    }
    if (length == 0) {
      // Whitespace. '\s+(?!\S)' takes the run but leaves its last character to prefix the following word;
      // a single whitespace character before a non-space falls through to '\s+'.
      size_t j = i + 1;
      while (j < end && chars[j].cls == CharClass::space) ++j;
      length = (j < end && j - i >= 2) ? j - i - 1 : j - i;
    }
    out.emplace_back(i, i + length);
    i += length;
  }
}

}  // namespace

Pretokenizer Pretokenizer::from_name(std::string_view name) {
  static constexpr std::array<std::string_view, 6> kDigitSplitting = {"smollm",   "starcoder", "refact",
                                                                      "command-r", "codeshell", "exaone"};
  for (std::string_view n : kDigitSplitting) {
    if (name == n) return Pretokenizer(PretokenizerKind::smollm);
  }
  if (name == "gpt2" || name == "gpt-2") return Pretokenizer(PretokenizerKind::gpt2);
  throw std::invalid_argument("unsupported pre-tokenizer \"" + std::string(name) +
                              "\" (supported: smollm and its aliases, gpt2)");
}

std::vector<std::string_view> Pretokenizer::split(std::string_view text) const {
  const std::vector<CharInfo> chars = decode_chars(text);
  std::vector<std::pair<size_t, size_t>> ranges;  // [first, last) char indices
  if (kind_ == PretokenizerKind::gpt2) {
    split_gpt2(chars, 0, chars.size(), ranges);
  } else {
    size_t segment = 0;
    for (size_t i = 0; i < chars.size(); ++i) {
      if (chars[i].cls != CharClass::number) continue;
      split_gpt2(chars, segment, i, ranges);
      ranges.emplace_back(i, i + 1);
      segment = i + 1;
    }
    split_gpt2(chars, segment, chars.size(), ranges);
  }
  std::vector<std::string_view> pieces;
  pieces.reserve(ranges.size());
  for (auto [first, last] : ranges) {
    const size_t from = chars[first].offset;
    const size_t to = last < chars.size() ? chars[last].offset : text.size();
    pieces.push_back(text.substr(from, to - from));
  }
  return pieces;
}

}  // namespace strata
