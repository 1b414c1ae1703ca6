#include "grammar/code_point_set.h"

#include <algorithm>
#include <string>

namespace strata::grammar {

namespace {

constexpr char32_t kSurrogateFirst = 0xD800, kSurrogateLast = 0xDFFF;

std::string encode_utf8(char32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

// [first, last] all encode to `length` bytes. Splits it until every byte position of the encodings ranges
// independently over an interval (a "rectangle"), then emits one sequence per rectangle.
void split_same_length(char32_t first, char32_t last, int length, std::vector<ByteRangeSequence>& out) {
  for (int tail = 1; tail < length; ++tail) {
    char32_t low_bits = (char32_t{1} << (6 * tail)) - 1;
    if ((first & ~low_bits) == (last & ~low_bits)) continue;
    if ((first & low_bits) != 0) {
      split_same_length(first, first | low_bits, length, out);
      split_same_length((first | low_bits) + 1, last, length, out);
      return;
    }
    if ((last & low_bits) != low_bits) {
      split_same_length(first, (last & ~low_bits) - 1, length, out);
      split_same_length(last & ~low_bits, last, length, out);
      return;
    }
  }
  std::string a = encode_utf8(first), b = encode_utf8(last);
  ByteRangeSequence sequence;
  for (size_t i = 0; i < a.size(); ++i) sequence.emplace_back(uint8_t(a[i]), uint8_t(b[i]));
  out.push_back(std::move(sequence));
}

}  // namespace

void CodePointSet::add(char32_t first, char32_t last) {
  last = std::min(last, kMaxCodePoint);
  if (first > last) return;
  if (first <= kSurrogateLast && last >= kSurrogateFirst) {  // cut the surrogates out
    if (first < kSurrogateFirst) ranges_.emplace_back(first, kSurrogateFirst - 1);
    if (last > kSurrogateLast) ranges_.emplace_back(kSurrogateLast + 1, last);
  } else {
    ranges_.emplace_back(first, last);
  }
  normalize();
}

void CodePointSet::add(const CodePointSet& other) {
  ranges_.insert(ranges_.end(), other.ranges_.begin(), other.ranges_.end());
  normalize();
}

void CodePointSet::remove(char32_t code_point) {
  std::vector<std::pair<char32_t, char32_t>> kept;
  for (auto [first, last] : ranges_) {
    if (code_point < first || code_point > last) {
      kept.emplace_back(first, last);
      continue;
    }
    if (first < code_point) kept.emplace_back(first, code_point - 1);
    if (code_point < last) kept.emplace_back(code_point + 1, last);
  }
  ranges_ = std::move(kept);
}

CodePointSet CodePointSet::complement() const {
  CodePointSet result;
  char32_t next = 0;
  for (auto [first, last] : ranges_) {
    if (first > next) result.add(next, first - 1);
    next = last + 1;
  }
  if (next <= kMaxCodePoint) result.add(next, kMaxCodePoint);
  return result;
}

bool CodePointSet::contains(char32_t code_point) const {
  for (auto [first, last] : ranges_) {
    if (code_point >= first && code_point <= last) return true;
  }
  return false;
}

void CodePointSet::normalize() {
  std::sort(ranges_.begin(), ranges_.end());
  std::vector<std::pair<char32_t, char32_t>> merged;
  for (auto range : ranges_) {
    if (!merged.empty() && range.first <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, range.second);
    } else {
      merged.push_back(range);
    }
  }
  ranges_ = std::move(merged);
}

std::vector<ByteRangeSequence> utf8_byte_ranges(char32_t first, char32_t last) {
  static constexpr char32_t kLengthLimits[] = {0x7F, 0x7FF, 0xFFFF, kMaxCodePoint};
  std::vector<ByteRangeSequence> out;
  char32_t length_start = 0;
  for (int length = 1; length <= 4; ++length) {
    char32_t lo = std::max(first, length_start), hi = std::min(last, kLengthLimits[length - 1]);
    if (lo <= hi) split_same_length(lo, hi, length, out);
    length_start = kLengthLimits[length - 1] + 1;
  }
  return out;
}

}  // namespace strata::grammar
