#include "grammar/string_pattern.h"

#include <optional>
#include <vector>

namespace strata::grammar {

namespace {

CodePointSet set_of(std::initializer_list<std::pair<char32_t, char32_t>> ranges) {
  CodePointSet set;
  for (auto [first, last] : ranges) set.add(first, last);
  return set;
}

CodePointSet digit_set() { return set_of({{'0', '9'}}); }
CodePointSet word_set() { return set_of({{'0', '9'}, {'A', 'Z'}, {'a', 'z'}, {'_', '_'}}); }
// ECMAScript's \s: ASCII blanks and the Unicode spaces and line terminators.
CodePointSet space_set() {
  return set_of({{'\t', '\r'}, {' ', ' '}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029},
                 {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}});
}
CodePointSet dot_set() {  // everything but line terminators
  return set_of({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}).complement();
}

class PatternParser {
 public:
  PatternParser(JsonGrammarBuilder& json, std::string_view pattern) : json_(json), g_(json.builder()), p_(pattern) {}

  uint32_t parse();

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw PatternError("pattern " + std::string(p_) + ": " + what + " at offset " + std::to_string(pos_));
  }
  bool at_end() const { return pos_ >= p_.size(); }
  char peek() const { return at_end() ? '\0' : p_[pos_]; }
  bool take(char c) {
    if (peek() != c || at_end()) return false;
    ++pos_;
    return true;
  }

  uint32_t alternation(int& branches);
  uint32_t concatenation();
  uint32_t quantified();
  uint32_t atom();
  bool quantifier(uint32_t& min_count, uint32_t& max_count);
  uint32_t count();
  CodePointSet character_class();
  // An escape after '\': a set (\d, \w, ...) or one character.
  CodePointSet escape(bool in_class, std::optional<char32_t>& single);
  char32_t code_point();
  char32_t hex(int digits);

  JsonGrammarBuilder& json_;
  GrammarBuilder& g_;
  std::string_view p_;
  size_t pos_ = 0;
  bool anchored_end_ = false;
};

uint32_t PatternParser::parse() {
  bool anchored_start = take('^');
  int branches = 0;
  uint32_t body = alternation(branches);
  if (!at_end()) fail("unbalanced ')'");
  if (branches > 1 && (anchored_start || anchored_end_)) {
    fail("'^' or '$' with a top-level '|': put the alternatives in a group, as in ^(a|b)$,");
  }
  std::vector<uint32_t> parts;
  uint32_t anything = g_.repeat(json_.string_char(), 0, kUnbounded);
  if (!anchored_start) parts.push_back(anything);
  parts.push_back(body);
  if (!anchored_end_) parts.push_back(anything);
  return g_.sequence(std::move(parts));
}

uint32_t PatternParser::alternation(int& branches) {
  std::vector<uint32_t> alternatives{concatenation()};
  while (take('|')) alternatives.push_back(concatenation());
  branches = static_cast<int>(alternatives.size());
  return g_.choice(std::move(alternatives));
}

uint32_t PatternParser::concatenation() {
  std::vector<uint32_t> items;
  while (!at_end() && peek() != '|' && peek() != ')') {
    if (peek() == '$') {
      if (pos_ + 1 != p_.size()) fail("'$' only at the end of the pattern");
      anchored_end_ = true;
      ++pos_;
      break;
    }
    items.push_back(quantified());
  }
  return g_.sequence(std::move(items));
}

uint32_t PatternParser::quantified() {
  uint32_t item = atom();
  uint32_t min_count = 0, max_count = 0;
  if (!quantifier(min_count, max_count)) return item;
  take('?');  // lazy: the same strings match
  if (peek() == '*' || peek() == '+' || peek() == '?' || peek() == '{') fail("a quantifier after a quantifier");
  if (g_.nullable(item)) {
    if (min_count == 0 && max_count == 1) return item;
    fail("a quantifier on something that can match the empty string");
  }
  return g_.repeat(item, min_count, max_count);
}

bool PatternParser::quantifier(uint32_t& min_count, uint32_t& max_count) {
  if (take('*')) return min_count = 0, max_count = kUnbounded, true;
  if (take('+')) return min_count = 1, max_count = kUnbounded, true;
  if (take('?')) return min_count = 0, max_count = 1, true;
  if (!take('{')) return false;
  min_count = count();
  max_count = min_count;
  if (take(',')) max_count = peek() == '}' ? kUnbounded : count();
  if (!take('}')) fail("a '{' that is not a quantifier {n}, {n,} or {n,m} (write \\{ for a brace)");
  if (max_count < min_count) fail("a quantifier {n,m} with m < n");
  return true;
}

uint32_t PatternParser::count() {
  if (peek() < '0' || peek() > '9') fail("a '{' that is not a quantifier {n}, {n,} or {n,m} (write \\{ for a brace)");
  uint32_t value = 0;
  while (peek() >= '0' && peek() <= '9') {
    value = value * 10 + (p_[pos_++] - '0');
    if (value > kMaxPatternRepeat) fail("a repeat count above " + std::to_string(kMaxPatternRepeat));
  }
  return value;
}

uint32_t PatternParser::atom() {
  char c = peek();
  if (c == '*' || c == '+' || c == '?' || c == '{') fail("nothing to repeat");
  if (c == '^') fail("'^' only at the start of the pattern");
  if (take('(')) {
    if (take('?') && !take(':')) fail("lookaround and named groups are not supported");
    int branches = 0;
    uint32_t inner = alternation(branches);
    if (!take(')')) fail("a '(' without its ')'");
    return inner;
  }
  CodePointSet set;
  if (take('[')) {
    set = character_class();
  } else if (take('.')) {
    set = dot_set();
  } else if (take('\\')) {
    std::optional<char32_t> single;
    set = escape(false, single);
    if (single) set.add(*single);
  } else {
    set.add(code_point());
  }
  return json_.code_points(set);
}

CodePointSet PatternParser::character_class() {
  bool negated = take('^');
  CodePointSet set;
  while (!take(']')) {
    if (at_end()) fail("a '[' without its ']'");
    std::optional<char32_t> low;
    if (take('\\')) {
      set.add(escape(true, low));
    } else {
      low = code_point();
    }
    if (!low) continue;  // a class escape such as \d cannot start a range
    if (peek() == '-' && pos_ + 1 < p_.size() && p_[pos_ + 1] != ']') {
      ++pos_;
      std::optional<char32_t> high;
      if (take('\\')) {
        if (!escape(true, high).empty() || !high) fail("a range ending in a class escape");
      } else {
        high = code_point();
      }
      if (*high < *low) fail("a range out of order");
      set.add(*low, *high);
    } else {
      set.add(*low);
    }
  }
  if (negated) set = set.complement();
  if (set.empty()) fail("a character class that matches nothing");
  return set;
}

CodePointSet PatternParser::escape(bool in_class, std::optional<char32_t>& single) {
  if (at_end()) fail("a '\\' at the end");
  char c = p_[pos_++];
  switch (c) {
    case 'd': return digit_set();
    case 'D': return digit_set().complement();
    case 'w': return word_set();
    case 'W': return word_set().complement();
    case 's': return space_set();
    case 'S': return space_set().complement();
    case 'n': single = '\n'; return {};
    case 't': single = '\t'; return {};
    case 'r': single = '\r'; return {};
    case 'f': single = '\f'; return {};
    case 'v': single = '\v'; return {};
    case '0': single = U'\0'; return {};
    case 'u': single = hex(4); return {};
    case 'x': single = hex(2); return {};
    case 'b':
      if (in_class) { single = '\b'; return {}; }
      fail("word boundaries (\\b) are not supported");
    default: break;
  }
  if (c >= '1' && c <= '9') fail("backreferences are not supported");
  bool alphanumeric = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
  if (alphanumeric || static_cast<unsigned char>(c) >= 0x80) fail(std::string("unsupported escape \\") + c);
  single = static_cast<char32_t>(c);  // an escaped punctuation character stands for itself
  return {};
}

char32_t PatternParser::hex(int digits) {
  char32_t value = 0;
  for (int i = 0; i < digits; ++i) {
    char c = peek();
    int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (digit < 0) fail("a \\u or \\x escape without its hex digits");
    value = value * 16 + digit;
    ++pos_;
  }
  if (value >= 0xD800 && value <= 0xDFFF) fail("a surrogate escape (write the character itself)");
  return value;
}

// Decodes one UTF-8 character (the schema came through a JSON parser: the text is valid UTF-8).
char32_t PatternParser::code_point() {
  unsigned char lead = static_cast<unsigned char>(p_[pos_++]);
  int extra = lead < 0x80 ? 0 : lead < 0xE0 ? 1 : lead < 0xF0 ? 2 : 3;
  char32_t value = extra == 0 ? lead : lead & (0x3F >> extra);
  for (int i = 0; i < extra; ++i) {
    if (at_end()) fail("a truncated UTF-8 character");
    value = (value << 6) | (static_cast<unsigned char>(p_[pos_++]) & 0x3F);
  }
  return value;
}

}  // namespace

uint32_t string_pattern(JsonGrammarBuilder& json, std::string_view pattern) {
  return PatternParser(json, pattern).parse();
}

}  // namespace strata::grammar
