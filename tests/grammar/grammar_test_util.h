#pragma once
// Helpers of the grammar tests: compile a schema given as text, and ask whether a text is a complete match or a
// prefix that can still become one.
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "grammar/grammar_matcher.h"
#include "grammar/json_schema.h"

namespace strata::grammar::test {

inline std::shared_ptr<const Grammar> schema_grammar(std::string_view schema_text, JsonStyle style = {}) {
  return compile_json_schema(nlohmann::ordered_json::parse(schema_text), SchemaOptions{style, ""});
}

// The whole text is a complete match.
inline bool matches(const std::shared_ptr<const Grammar>& grammar, std::string_view text) {
  GrammarMatcher matcher(grammar);
  return matcher.advance(text) && matcher.is_complete();
}

// The text can still be extended to a match (or is one).
inline bool viable(const std::shared_ptr<const Grammar>& grammar, std::string_view text) {
  GrammarMatcher matcher(grammar);
  return matcher.advance(text);
}

// The message of the SchemaError that compiling `schema_text` throws ("" when it compiles).
inline std::string schema_error(std::string_view schema_text, std::string prefix = "") {
  try {
    compile_json_schema(nlohmann::ordered_json::parse(schema_text), SchemaOptions{JsonStyle{}, std::move(prefix)});
  } catch (const SchemaError& error) {
    return error.what();
  }
  return "";
}

}  // namespace strata::grammar::test
