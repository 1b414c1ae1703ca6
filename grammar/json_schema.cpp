#include "grammar/json_schema.h"

#include <algorithm>
#include <array>
#include <map>
#include <set>
#include <string_view>
#include <vector>

#include "grammar/number_range.h"
#include "grammar/string_pattern.h"

namespace strata::grammar {

namespace {

using Json = nlohmann::ordered_json;

const std::set<std::string_view> kAnnotations = {"title",   "description", "$schema",    "$id",       "$comment",
                                                 "default", "examples",    "deprecated", "readOnly", "writeOnly"};

// Keywords that constrain values but are not implemented: refused with the reason, never ignored.
const std::map<std::string_view, std::string_view> kRefused = {
    {"$ref", "references ($ref, $defs) are not supported: inline the schema"},
    {"$defs", "references ($ref, $defs) are not supported: inline the schema"},
    {"definitions", "references ($ref, $defs) are not supported: inline the schema"},
    {"oneOf", "oneOf is not supported (anyOf is)"},
    {"allOf", "allOf is not supported: merge the schemas"},
    {"not", "not is not supported"},
    {"if", "if/then/else is not supported"},
    {"then", "if/then/else is not supported"},
    {"else", "if/then/else is not supported"},
    {"patternProperties", "patternProperties is not supported"},
    {"propertyNames", "propertyNames is not supported"},
    {"dependentRequired", "dependentRequired is not supported"},
    {"dependentSchemas", "dependentSchemas is not supported"},
    {"dependencies", "dependencies is not supported"},
    {"minProperties", "minProperties is not supported"},
    {"maxProperties", "maxProperties is not supported"},
    {"unevaluatedProperties", "unevaluatedProperties is not supported"},
    {"prefixItems", "prefixItems is not supported"},
    {"contains", "contains is not supported"},
    {"minContains", "minContains is not supported"},
    {"maxContains", "maxContains is not supported"},
    {"unevaluatedItems", "unevaluatedItems is not supported"},
    {"uniqueItems", "uniqueItems is not supported (false is accepted)"},
    {"multipleOf", "multipleOf is not supported"},
    {"format", "format is not supported: use pattern"},
    {"contentEncoding", "contentEncoding is not supported"},
    {"contentMediaType", "contentMediaType is not supported"},
};

// The supported keywords, and the type each one implies when a schema has no "type".
const std::map<std::string_view, std::string_view> kKeywordType = {
    {"properties", "object"}, {"required", "object"}, {"additionalProperties", "object"},
    {"items", "array"},       {"minItems", "array"},  {"maxItems", "array"},
    {"pattern", "string"},    {"minLength", "string"}, {"maxLength", "string"},
    {"minimum", "number"},    {"maximum", "number"},  {"exclusiveMinimum", "number"},
    {"exclusiveMaximum", "number"}};
const std::vector<std::string> kTypes = {"null", "boolean", "integer", "number", "string", "array", "object"};

std::string pointer_token(std::string_view key) {
  std::string token;
  for (char c : key) {
    if (c == '~') {
      token += "~0";
    } else if (c == '/') {
      token += "~1";
    } else {
      token += c;
    }
  }
  return token;
}

std::string child(const std::string& pointer, std::string_view key) { return pointer + "/" + pointer_token(key); }
std::string child(const std::string& pointer, size_t index) { return pointer + "/" + std::to_string(index); }

bool has_type(const Json& value, const std::string& type) {
  if (type == "null") return value.is_null();
  if (type == "boolean") return value.is_boolean();
  if (type == "string") return value.is_string();
  if (type == "array") return value.is_array();
  if (type == "object") return value.is_object();
  if (type == "number") return value.is_number();
  if (value.is_number_integer()) return true;  // integer
  return value.is_number_float() && value.get<double>() == static_cast<double>(static_cast<int64_t>(value.get<double>()));
}

class SchemaCompiler {
 public:
  SchemaCompiler(GrammarBuilder& builder, const SchemaOptions& options)
      : json_(builder, options.style), g_(builder), prefix_(options.location_prefix) {}

  uint32_t compile(const Json& schema, const std::string& pointer);

 private:
  [[noreturn]] void fail(const std::string& pointer, const std::string& reason) const {
    std::string location = prefix_ + pointer;
    throw SchemaError(location.empty() ? "schema" : location, pointer, reason);
  }
  void check_keywords(const Json& schema, const std::string& pointer);
  void check_shape(std::string_view key, const Json& value, const std::string& pointer);
  uint32_t enumeration(const Json& schema, const std::string& pointer);
  uint32_t any_of(const Json& schema, const std::string& pointer);
  std::vector<std::string> types(const Json& schema, const std::string& pointer);
  uint32_t typed(const std::string& type, const Json& schema, const std::string& pointer);
  uint32_t object(const Json& schema, const std::string& pointer);
  uint32_t members(const Json& schema, const std::string& pointer);
  uint32_t array(const Json& schema, const std::string& pointer);
  uint32_t string(const Json& schema, const std::string& pointer);
  uint32_t number(const Json& schema, const std::string& pointer, bool integer);
  uint32_t count(const Json& schema, const char* key, uint32_t fallback) const {
    return schema.contains(key) ? schema[key].get<uint32_t>() : fallback;
  }
  uint32_t sub_schema(const Json& schema, const char* key, const std::string& pointer) {
    return schema.contains(key) ? compile(schema[key], child(pointer, key)) : json_.any_value();
  }

  JsonGrammarBuilder json_;
  GrammarBuilder& g_;
  std::string prefix_;
};

uint32_t SchemaCompiler::compile(const Json& schema, const std::string& pointer) {
  if (schema.is_boolean()) {
    if (!schema.get<bool>()) fail(pointer, "the schema false admits no value");
    return json_.any_value();
  }
  if (!schema.is_object()) fail(pointer, "must be an object or a boolean");
  check_keywords(schema, pointer);
  if (schema.contains("enum") || schema.contains("const")) return enumeration(schema, pointer);
  if (schema.contains("anyOf")) return any_of(schema, pointer);
  std::vector<std::string> listed = types(schema, pointer);
  if (listed.empty()) return json_.any_value();
  std::vector<uint32_t> alternatives;
  for (const std::string& type : listed) alternatives.push_back(typed(type, schema, pointer));
  return g_.choice(std::move(alternatives));
}

void SchemaCompiler::check_keywords(const Json& schema, const std::string& pointer) {
  for (const auto& [key, value] : schema.items()) {
    if (kAnnotations.count(key) || key == "type" || key == "enum" || key == "const" || key == "anyOf") {
      check_shape(key, value, child(pointer, key));
      continue;
    }
    if (kKeywordType.count(key)) {
      check_shape(key, value, child(pointer, key));
      continue;
    }
    if (key == "uniqueItems" && value == Json(false)) continue;
    auto refused = kRefused.find(key);
    if (refused != kRefused.end()) fail(child(pointer, key), std::string(refused->second));
    fail(child(pointer, key), "unknown keyword");
  }
  if (schema.contains("minItems") && schema.contains("maxItems") && schema["minItems"] > schema["maxItems"]) {
    fail(child(pointer, "maxItems"), "is less than minItems");
  }
  if (schema.contains("minLength") && schema.contains("maxLength") && schema["minLength"] > schema["maxLength"]) {
    fail(child(pointer, "maxLength"), "is less than minLength");
  }
}

// The shape each keyword must have, checked even where the keyword does not apply (minimum on a string), so that
// a malformed schema is refused at the part that is wrong.
void SchemaCompiler::check_shape(std::string_view key, const Json& value, const std::string& pointer) {
  if (key == "type") {
    if (value.is_string()) {
      if (std::find(kTypes.begin(), kTypes.end(), value.get<std::string>()) == kTypes.end()) {
        fail(pointer, "unknown type \"" + value.get<std::string>() + "\"");
      }
      return;
    }
    if (!value.is_array() || value.empty()) fail(pointer, "must be a type name or a non-empty array of them");
    std::set<std::string> seen;
    for (size_t i = 0; i < value.size(); ++i) {
      if (!value[i].is_string()) fail(child(pointer, i), "must be a type name");
      check_shape("type", value[i], child(pointer, i));
      if (!seen.insert(value[i].get<std::string>()).second) fail(child(pointer, i), "repeats a type");
    }
  } else if (key == "enum" || key == "anyOf") {
    if (!value.is_array() || value.empty()) fail(pointer, "must be a non-empty array");
  } else if (key == "properties") {
    if (!value.is_object()) fail(pointer, "must be an object");
  } else if (key == "required") {
    if (!value.is_array()) fail(pointer, "must be an array of property names");
    for (size_t i = 0; i < value.size(); ++i) {
      if (!value[i].is_string()) fail(child(pointer, i), "must be a string");
    }
  } else if (key == "additionalProperties" || key == "items") {
    if (!value.is_object() && !value.is_boolean()) fail(pointer, "must be a schema (an object or a boolean)");
  } else if (key == "pattern") {
    if (!value.is_string()) fail(pointer, "must be a string");
  } else if (key == "minItems" || key == "maxItems" || key == "minLength" || key == "maxLength") {
    if (!value.is_number_unsigned() && !(value.is_number_integer() && value.get<int64_t>() >= 0)) {
      fail(pointer, "must be a non-negative integer");
    }
    if (value.get<uint64_t>() >= kUnbounded) fail(pointer, "is too large");
  } else if (key == "minimum" || key == "maximum" || key == "exclusiveMinimum" || key == "exclusiveMaximum") {
    if (!value.is_number()) fail(pointer, "must be a number");
    if (!decimal_from_json(value)) fail(pointer, "must be a finite number of magnitude below 1e18");
  }
}

uint32_t SchemaCompiler::enumeration(const Json& schema, const std::string& pointer) {
  for (const auto& [key, value] : schema.items()) {
    if (key != "enum" && key != "const" && key != "type" && !kAnnotations.count(key)) {
      fail(child(pointer, key), "cannot be combined with enum or const (only type can)");
    }
  }
  if (schema.contains("enum") && schema.contains("const")) fail(child(pointer, "const"), "cannot be combined with enum");
  Json values = schema.contains("const") ? Json::array({schema["const"]}) : schema["enum"];
  std::vector<std::string> allowed_types = types(schema, pointer);
  std::vector<uint32_t> alternatives;
  for (const Json& value : values) {
    bool typed_ok = allowed_types.empty() ||
                    std::any_of(allowed_types.begin(), allowed_types.end(),
                                [&](const std::string& type) { return has_type(value, type); });
    if (typed_ok) alternatives.push_back(json_.literal_value(value));
  }
  if (alternatives.empty()) {
    fail(child(pointer, schema.contains("const") ? "const" : "enum"), "no value has the schema's type");
  }
  return g_.choice(std::move(alternatives));
}

uint32_t SchemaCompiler::any_of(const Json& schema, const std::string& pointer) {
  for (const auto& [key, value] : schema.items()) {
    if (key != "anyOf" && !kAnnotations.count(key)) {
      fail(child(pointer, key), "cannot be combined with anyOf: put it in each branch");
    }
  }
  const Json& branches = schema["anyOf"];
  std::vector<uint32_t> alternatives;
  for (size_t i = 0; i < branches.size(); ++i) {
    alternatives.push_back(compile(branches[i], child(child(pointer, "anyOf"), i)));
  }
  return g_.choice(std::move(alternatives));
}

// The listed types; without "type", those the keywords imply (none: any value).
std::vector<std::string> SchemaCompiler::types(const Json& schema, const std::string& pointer) {
  std::vector<std::string> listed;
  if (schema.contains("type")) {
    const Json& type = schema["type"];
    if (type.is_string()) return {type.get<std::string>()};
    for (const Json& name : type) listed.push_back(name.get<std::string>());
    return listed;
  }
  for (const std::string& type : kTypes) {
    for (const auto& [key, implied] : kKeywordType) {
      if (implied == type && schema.contains(key)) {
        listed.push_back(type);
        break;
      }
    }
  }
  return listed;
}

uint32_t SchemaCompiler::typed(const std::string& type, const Json& schema, const std::string& pointer) {
  if (type == "null") return g_.literal("null");
  if (type == "boolean") return g_.choice({g_.literal("true"), g_.literal("false")});
  if (type == "integer") return number(schema, pointer, true);
  if (type == "number") return number(schema, pointer, false);
  if (type == "string") return string(schema, pointer);
  if (type == "array") return array(schema, pointer);
  return object(schema, pointer);
}

uint32_t SchemaCompiler::object(const Json& schema, const std::string& pointer) {
  bool has_properties = (schema.contains("properties") && !schema["properties"].empty()) ||
                        (schema.contains("required") && !schema["required"].empty());
  if (has_properties) return members(schema, pointer);
  if (schema.contains("additionalProperties") && schema["additionalProperties"] == Json(false)) {
    std::vector<uint32_t> empty{g_.literal("{")};
    json_.whitespace(empty);
    empty.push_back(g_.literal("}"));
    return g_.sequence(std::move(empty));
  }
  return json_.free_object(sub_schema(schema, "additionalProperties", pointer));
}

// The properties in schema order; each optional one may be skipped. rest[i][c] is "the members from i on, c:
// whether a member came before (so the next one needs a comma)": 2n nodes, shared by the skipping paths.
uint32_t SchemaCompiler::members(const Json& schema, const std::string& pointer) {
  if (schema.contains("additionalProperties") && schema["additionalProperties"] != Json(false)) {
    fail(child(pointer, "additionalProperties"), "only false is supported beside properties");
  }
  const Json properties = schema.contains("properties") ? schema["properties"] : Json::object();
  std::set<std::string> required;
  if (schema.contains("required")) {
    const Json& names = schema["required"];
    for (size_t i = 0; i < names.size(); ++i) {
      if (!properties.contains(names[i].get<std::string>())) {
        fail(child(child(pointer, "required"), i), "names a property that properties does not define");
      }
      required.insert(names[i].get<std::string>());
    }
  }
  struct Member {
    uint32_t text;  // "key": value
    bool required;
  };
  std::vector<Member> list;
  for (const auto& [name, sub] : properties.items()) {
    std::vector<uint32_t> text{g_.literal(Json(name).dump())};
    json_.whitespace(text);
    text.push_back(g_.literal(":"));
    json_.whitespace(text);
    text.push_back(compile(sub, child(child(pointer, "properties"), name)));
    json_.whitespace(text);
    list.push_back(Member{g_.sequence(std::move(text)), required.count(name) > 0});
  }
  std::vector<uint32_t> comma{g_.literal(",")};
  json_.whitespace(comma);
  uint32_t separator = g_.sequence(std::move(comma));
  std::vector<std::array<uint32_t, 2>> rest(list.size() + 1);
  rest[list.size()] = {g_.empty(), g_.empty()};
  for (size_t i = list.size(); i-- > 0;) {
    for (int after_member = 0; after_member < 2; ++after_member) {
      uint32_t taken = after_member ? g_.sequence({separator, list[i].text, rest[i + 1][1]})
                                    : g_.sequence({list[i].text, rest[i + 1][1]});
      rest[i][after_member] = list[i].required ? taken : g_.choice({taken, rest[i + 1][after_member]});
    }
  }
  std::vector<uint32_t> object{g_.literal("{")};
  json_.whitespace(object);
  object.push_back(rest[0][0]);
  object.push_back(g_.literal("}"));
  return g_.sequence(std::move(object));
}

uint32_t SchemaCompiler::array(const Json& schema, const std::string& pointer) {
  uint32_t item = sub_schema(schema, "items", pointer);
  return json_.array(item, count(schema, "minItems", 0), count(schema, "maxItems", kUnbounded));
}

uint32_t SchemaCompiler::string(const Json& schema, const std::string& pointer) {
  if (!schema.contains("pattern")) {
    return json_.string(count(schema, "minLength", 0), count(schema, "maxLength", kUnbounded));
  }
  for (const char* length : {"minLength", "maxLength"}) {
    if (schema.contains(length)) fail(child(pointer, length), "cannot be combined with pattern");
  }
  try {
    uint32_t content = string_pattern(json_, schema["pattern"].get<std::string>());
    return g_.sequence({g_.literal("\""), content, g_.literal("\"")});
  } catch (const PatternError& error) {
    fail(child(pointer, "pattern"), error.what());
  }
}

uint32_t SchemaCompiler::number(const Json& schema, const std::string& pointer, bool integer) {
  NumberBounds bounds;
  // Of "minimum" and "exclusiveMinimum" (both may be given) the larger one binds; the same for the maxima.
  auto take = [&](const char* key, bool lower, bool exclusive) {
    if (!schema.contains(key)) return;
    double value = schema[key].get<double>();
    std::optional<Decimal>& bound = lower ? bounds.lower : bounds.upper;
    bool& bound_exclusive = lower ? bounds.lower_exclusive : bounds.upper_exclusive;
    const char* other = lower ? (exclusive ? "minimum" : "exclusiveMinimum")
                              : (exclusive ? "maximum" : "exclusiveMaximum");
    if (bound && schema.contains(other)) {
      double current = schema[other].get<double>();
      bool tighter = lower ? value > current || (value == current && exclusive)
                           : value < current || (value == current && exclusive);
      if (!tighter) return;
    }
    bound = decimal_from_json(schema[key]);
    bound_exclusive = exclusive;
  };
  take("minimum", true, false);
  take("exclusiveMinimum", true, true);
  take("maximum", false, false);
  take("exclusiveMaximum", false, true);
  if (!bounds.lower && !bounds.upper) return integer ? json_.integer() : json_.number();
  std::optional<uint32_t> node = bounded_number(json_, bounds, integer);
  if (!node) fail(pointer, std::string("no ") + (integer ? "integer" : "number") + " lies within the bounds");
  return *node;
}

}  // namespace

std::shared_ptr<const Grammar> compile_json_schema(const nlohmann::ordered_json& schema,
                                                   const SchemaOptions& options) {
  GrammarBuilder builder;
  SchemaCompiler compiler(builder, options);
  uint32_t root = compiler.compile(schema, "");
  return std::make_shared<const Grammar>(std::move(builder).finish(root));
}

std::shared_ptr<const Grammar> compile_json_schema(const nlohmann::json& schema, const SchemaOptions& options) {
  return compile_json_schema(nlohmann::ordered_json::parse(schema.dump()), options);
}

std::shared_ptr<const Grammar> any_json_object_grammar(const JsonStyle& style) {
  GrammarBuilder builder;
  JsonGrammarBuilder json(builder, style);
  uint32_t root = json.free_object(json.any_value());
  return std::make_shared<const Grammar>(std::move(builder).finish(root));
}

}  // namespace strata::grammar
