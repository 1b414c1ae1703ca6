#pragma once
// JSON Schema -> Grammar. The supported subset (docs/structured-output.md): type (one or a list), properties,
// required, additionalProperties, items, minItems, maxItems, enum, const, anyOf, pattern (a regex subset:
// string_pattern.h), minLength, maxLength, minimum, maximum, exclusiveMinimum, exclusiveMaximum, and the
// annotations (title, description, default, examples, $schema, $id, $comment, ...), which are ignored. Every
// other keyword is refused with a SchemaError naming it, never silently ignored, so a client never gets output
// that its schema would reject.
//
// Objects: properties come in the schema's key order (pass an ordered_json to keep the client's order); every
// required property appears, optional ones may be left out; with `properties` no other key is generated
// (additionalProperties false, as OpenAI's strict mode). `{"type": "object"}` alone is any JSON object.
#include <memory>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"
#include "grammar/json_grammar.h"

namespace strata::grammar {

// A schema the compiler refuses. what(): "<location>: <reason>", where location is the options' prefix followed
// by the JSON pointer of the bad part ("response_format.json_schema.schema/properties/age/minimum: must be a
// number"). pointer() is the JSON pointer alone ("" for the root).
class SchemaError : public std::invalid_argument {
 public:
  SchemaError(const std::string& location, std::string pointer, const std::string& reason)
      : std::invalid_argument(location + ": " + reason), pointer_(std::move(pointer)) {}
  const std::string& pointer() const { return pointer_; }

 private:
  std::string pointer_;
};

struct SchemaOptions {
  JsonStyle style;
  std::string location_prefix;  // what error messages put before the pointer, e.g. "response_format.json_schema.schema"
};

std::shared_ptr<const Grammar> compile_json_schema(const nlohmann::ordered_json& schema,
                                                   const SchemaOptions& options = {});
// The same, with the keys' order of nlohmann::json (alphabetical).
std::shared_ptr<const Grammar> compile_json_schema(const nlohmann::json& schema, const SchemaOptions& options = {});

// `response_format: {"type": "json_object"}`: any JSON object.
std::shared_ptr<const Grammar> any_json_object_grammar(const JsonStyle& style = {});

}  // namespace strata::grammar
