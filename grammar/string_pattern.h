#pragma once
// JSON Schema `pattern` (ECMAScript regular expressions) compiled to the grammar of a JSON string's content,
// for a documented subset (docs/structured-output.md): literals, `.`, classes `[...]` `[^...]` with ranges,
// `\d \D \w \W \s \S`, escapes, groups `(...)` `(?:...)`, alternation `|`, quantifiers `* + ? {n} {n,} {n,m}`
// (a trailing `?` for laziness is accepted: it does not change what matches), and `^` / `$` at the very start
// and end. Without `^` (or `$`) the pattern may match anywhere, as JSON Schema says: any characters may come
// before (after) it. Anything else (lookaround, backreferences, \b, named groups, flags) is refused.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "grammar/json_grammar.h"

namespace strata::grammar {

class PatternError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

inline constexpr uint32_t kMaxPatternRepeat = 1000;

// The content of a JSON string (without its quotes) that the pattern matches; throws PatternError.
uint32_t string_pattern(JsonGrammarBuilder& json, std::string_view pattern);

}  // namespace strata::grammar
