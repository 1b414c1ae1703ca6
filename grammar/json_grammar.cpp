#include "grammar/json_grammar.h"

#include <cstdio>

namespace strata::grammar {

namespace {

// The characters JSON forbids raw in a string, and how each is spelled escaped (one spelling each).
bool must_escape(char32_t cp) { return cp < 0x20 || cp == '"' || cp == '\\'; }

std::string escaped(char32_t cp) {
  switch (cp) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\b': return "\\b";
    case '\f': return "\\f";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    default: {
      char buffer[8];
      std::snprintf(buffer, sizeof buffer, "\\u%04x", static_cast<unsigned>(cp));
      return buffer;
    }
  }
}

}  // namespace

void JsonGrammarBuilder::whitespace(std::vector<uint32_t>& sequence) {
  if (style_.max_whitespace == 0) return;
  if (!whitespace_) {
    ByteSet blanks;
    for (uint8_t byte : {' ', '\t', '\n', '\r'}) blanks.add(byte);
    whitespace_ = g_.repeat(g_.bytes(blanks), 0, style_.max_whitespace);
  }
  sequence.push_back(*whitespace_);
}

uint32_t JsonGrammarBuilder::code_points(const CodePointSet& set) {
  std::vector<uint32_t> alternatives;
  ByteSet single_bytes;  // every one-byte spelling, merged into one node
  for (auto [first, last] : set.ranges()) {
    for (char32_t cp = first; cp <= last && cp < 0x80; ++cp) {
      if (must_escape(cp)) {
        alternatives.push_back(g_.literal(escaped(cp)));
      } else {
        single_bytes.add(static_cast<uint8_t>(cp));
      }
    }
    if (last < 0x80) continue;
    for (const ByteRangeSequence& ranges : utf8_byte_ranges(std::max<char32_t>(first, 0x80), last)) {
      std::vector<uint32_t> bytes;
      for (auto [lo, hi] : ranges) bytes.push_back(g_.byte_range(lo, hi));
      alternatives.push_back(g_.sequence(std::move(bytes)));
    }
  }
  if (!single_bytes.empty()) alternatives.insert(alternatives.begin(), g_.bytes(single_bytes));
  return g_.choice(std::move(alternatives));
}

uint32_t JsonGrammarBuilder::unescaped_char() {
  if (!unescaped_char_) {
    CodePointSet raw;
    raw.add(0x20, kMaxCodePoint);
    raw.remove('"');
    raw.remove('\\');
    unescaped_char_ = code_points(raw);
  }
  return *unescaped_char_;
}

uint32_t JsonGrammarBuilder::string_char() {
  if (string_char_) return *string_char_;
  ByteSet hex, hex_not_d;
  hex.add_range('0', '9');
  hex.add_range('a', 'f');
  hex.add_range('A', 'F');
  hex_not_d.add_range('0', '9');
  hex_not_d.add_range('a', 'c');
  hex_not_d.add_range('e', 'f');
  hex_not_d.add_range('A', 'C');
  hex_not_d.add_range('E', 'F');
  uint32_t hex_digit = g_.bytes(hex);
  // \uXXXX outside U+D800..U+DFFF: a lone surrogate would not decode (characters beyond the BMP go as UTF-8).
  ByteSet d_letter;
  d_letter.add('d');
  d_letter.add('D');
  uint32_t not_surrogate = g_.choice({g_.sequence({g_.bytes(hex_not_d), hex_digit, hex_digit, hex_digit}),
                                      g_.sequence({g_.bytes(d_letter), g_.byte_range('0', '7'), hex_digit, hex_digit})});
  ByteSet simple_escapes;
  for (uint8_t byte : {'"', '\\', '/', 'b', 'f', 'n', 'r', 't'}) simple_escapes.add(byte);
  uint32_t escape = g_.sequence(
      {g_.literal("\\"), g_.choice({g_.bytes(simple_escapes), g_.sequence({g_.literal("u"), not_surrogate})})});
  string_char_ = g_.choice({unescaped_char(), escape});
  return *string_char_;
}

uint32_t JsonGrammarBuilder::string(uint32_t min_chars, uint32_t max_chars) {
  return g_.sequence({g_.literal("\""), g_.repeat(string_char(), min_chars, max_chars), g_.literal("\"")});
}

uint32_t JsonGrammarBuilder::digits(uint32_t min_count, uint32_t max_count) {
  return g_.repeat(g_.byte_range('0', '9'), min_count, max_count);
}

uint32_t JsonGrammarBuilder::integer() {  // no "-0": one spelling per integer
  uint32_t nonzero = g_.sequence({g_.byte_range('1', '9'), digits(0, kMaxIntegerDigits - 1)});
  return g_.choice({g_.literal("0"), g_.sequence({g_.optional(g_.literal("-")), nonzero})});
}

uint32_t JsonGrammarBuilder::number() {
  uint32_t fraction = g_.optional(g_.sequence({g_.literal("."), digits(1, kMaxFractionDigits)}));
  ByteSet e, sign;
  e.add('e');
  e.add('E');
  sign.add('+');
  sign.add('-');
  uint32_t exponent =
      g_.optional(g_.sequence({g_.bytes(e), g_.optional(g_.bytes(sign)), digits(1, kMaxExponentDigits)}));
  uint32_t magnitude =
      g_.choice({g_.literal("0"), g_.sequence({g_.byte_range('1', '9'), digits(0, kMaxIntegerDigits - 1)})});
  return g_.sequence({g_.optional(g_.literal("-")), magnitude, fraction, exponent});
}

uint32_t JsonGrammarBuilder::literal_value(const nlohmann::ordered_json& value) { return g_.literal(value.dump()); }

uint32_t JsonGrammarBuilder::any_value() {
  if (any_value_) return *any_value_;
  any_value_ = g_.reserve();
  GrammarNode choice;
  choice.kind = NodeKind::choice;
  choice.children = {free_object(*any_value_), array(*any_value_, 0, kUnbounded), string(0, kUnbounded), number(),
                     g_.literal("true"), g_.literal("false"), g_.literal("null")};
  g_.define(*any_value_, std::move(choice));
  return *any_value_;
}

uint32_t JsonGrammarBuilder::free_object(uint32_t value) {
  std::vector<uint32_t> member{string(0, kUnbounded)};
  whitespace(member);
  member.push_back(g_.literal(":"));
  whitespace(member);
  member.push_back(value);
  whitespace(member);
  std::vector<uint32_t> more{g_.literal(",")};
  whitespace(more);
  more.push_back(g_.sequence(member));
  uint32_t members = g_.sequence({g_.sequence(member), g_.repeat(g_.sequence(std::move(more)), 0, kUnbounded)});
  std::vector<uint32_t> object{g_.literal("{")};
  whitespace(object);
  object.push_back(g_.choice({g_.literal("}"), g_.sequence({members, g_.literal("}")})}));
  return g_.sequence(std::move(object));
}

uint32_t JsonGrammarBuilder::array(uint32_t item, uint32_t min_items, uint32_t max_items) {
  std::vector<uint32_t> open{g_.literal("[")};
  whitespace(open);
  if (max_items == 0) return g_.sequence({g_.sequence(std::move(open)), g_.literal("]")});
  std::vector<uint32_t> first{item};
  whitespace(first);
  std::vector<uint32_t> more{g_.literal(",")};
  whitespace(more);
  more.push_back(item);
  whitespace(more);
  uint32_t rest_max = max_items == kUnbounded ? kUnbounded : max_items - 1;
  uint32_t rest = g_.repeat(g_.sequence(std::move(more)), min_items == 0 ? 0 : min_items - 1, rest_max);
  uint32_t items = g_.sequence({g_.sequence(std::move(first)), rest, g_.literal("]")});
  open.push_back(min_items == 0 ? g_.choice({g_.literal("]"), items}) : items);
  return g_.sequence(std::move(open));
}

}  // namespace strata::grammar
