#pragma once
// Sets of Unicode scalar values (ranges of code points, surrogates excluded) and their UTF-8 encodings as byte
// ranges, for character classes of patterns and for the characters a JSON string may hold.
#include <cstdint>
#include <utility>
#include <vector>

namespace strata::grammar {

inline constexpr char32_t kMaxCodePoint = 0x10FFFF;

class CodePointSet {
 public:
  void add(char32_t first, char32_t last);  // inclusive; surrogates (U+D800..U+DFFF) are dropped
  void add(char32_t code_point) { add(code_point, code_point); }
  void add(const CodePointSet& other);
  void remove(char32_t code_point);
  CodePointSet complement() const;  // within U+0000..U+10FFFF, surrogates excluded
  bool contains(char32_t code_point) const;
  bool empty() const { return ranges_.empty(); }
  const std::vector<std::pair<char32_t, char32_t>>& ranges() const { return ranges_; }  // sorted, disjoint

 private:
  void normalize();
  std::vector<std::pair<char32_t, char32_t>> ranges_;
};

// One way to spell a run of code points in UTF-8: byte i lies in ranges[i].
using ByteRangeSequence = std::vector<std::pair<uint8_t, uint8_t>>;

// The code points of [first, last] (no surrogates inside) as sequences of byte ranges whose union is exactly
// their UTF-8 encodings.
std::vector<ByteRangeSequence> utf8_byte_ranges(char32_t first, char32_t last);

}  // namespace strata::grammar
