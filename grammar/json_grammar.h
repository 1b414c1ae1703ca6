#pragma once
// The JSON building blocks every schema compiles from: whitespace between tokens, string characters (escapes,
// UTF-8), strings, unbounded numbers, containers, literals, and "any JSON value". Shared nodes (one string
// character, one any-value rule) are built once per grammar.
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/code_point_set.h"
#include "grammar/grammar.h"

namespace strata::grammar {

// Digits generated where no bound says otherwise: an integer part of at most 18 digits fits int64; fractions are
// cut at 18 digits and exponents at 2, so that every generated number parses to a finite double.
inline constexpr int kMaxIntegerDigits = 18;
inline constexpr int kMaxFractionDigits = 18;
inline constexpr int kMaxExponentDigits = 2;

struct JsonStyle {
  // Whitespace ([ \t\n\r]) allowed at each place between two JSON tokens: 0 (compact JSON) to a small bound, so
  // that a model can never spend its whole budget on spaces.
  uint32_t max_whitespace = 0;
};

class JsonGrammarBuilder {
 public:
  JsonGrammarBuilder(GrammarBuilder& builder, JsonStyle style) : g_(builder), style_(style) {}
  GrammarBuilder& builder() { return g_; }

  // Appends the whitespace run between two tokens (nothing in compact style).
  void whitespace(std::vector<uint32_t>& sequence);

  uint32_t string_char();                          // any character: UTF-8 or any escape (no lone surrogates)
  uint32_t string(uint32_t min_chars, uint32_t max_chars);  // "..." with a length in code points
  // The characters of `set`, each spelled one way: UTF-8 for most, \" \\ \n \t ... \u00XX for those that must be
  // escaped.
  uint32_t code_points(const CodePointSet& set);
  uint32_t number();                               // any number (digit caps above)
  uint32_t integer();                              // 0|-?[1-9][0-9]{0,17}
  uint32_t literal_value(const nlohmann::ordered_json& value);  // a JSON value as its compact text
  uint32_t any_value();                            // any JSON value (recursive)
  // {"key": value, ...} with free keys and values of one rule; [item, ...] with a count in [min, max].
  uint32_t free_object(uint32_t value);
  uint32_t array(uint32_t item, uint32_t min_items, uint32_t max_items);

 private:
  uint32_t digits(uint32_t min_count, uint32_t max_count);
  uint32_t unescaped_char();

  GrammarBuilder& g_;
  JsonStyle style_;
  std::optional<uint32_t> whitespace_, string_char_, any_value_, unescaped_char_;
};

}  // namespace strata::grammar
