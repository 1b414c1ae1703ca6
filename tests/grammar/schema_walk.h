#pragma once
// The property test's parts: a seeded generator of random schemas within the supported subset, a small
// validator of JSON values against them (written apart from the compiler, as the check), and a random walk that
// picks uniformly among the allowed tokens until an end token.
#include <cstdint>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "grammar/token_mask.h"

namespace strata::grammar::test {

using Schema = nlohmann::ordered_json;

class SchemaGenerator {
 public:
  explicit SchemaGenerator(uint32_t seed) : rng_(seed) {}

  Schema generate(int depth = 0) {
    int kinds = depth >= 3 ? 5 : 8;
    switch (pick(kinds)) {
      case 0: return string_schema();
      case 1: return integer_schema();
      case 2: return number_schema();
      case 3: return small_schema();
      case 4: return pick(2) ? Schema{{"enum", {"red", 7, nullptr, "x\"y", Schema{{"k", {1, 2}}}}}}
                             : Schema{{"const", "caf\xC3\xA9"}};
      case 5: return array_schema(depth);
      case 6: return object_schema(depth);
      default: {
        Schema branches = Schema::array();
        for (int i = 0, n = 2 + pick(2); i < n; ++i) branches.push_back(generate(depth + 1));
        return Schema{{"anyOf", branches}};
      }
    }
  }

 private:
  int pick(int n) { return static_cast<int>(rng_() % n); }

  Schema string_schema() {
    static const std::vector<std::string> patterns = {"^[a-z]{1,5}$", "^\\d{3}-\\d{2}$", "^(yes|no)$", "ab",
                                                      "^[A-Z][a-z]*$", "^\\w+$", "x?y+$", "^[ -~]{0,4}$"};
    Schema schema{{"type", "string"}};
    switch (pick(4)) {
      case 0: break;
      case 1:
        schema["minLength"] = pick(3);
        schema["maxLength"] = schema["minLength"].get<int>() + pick(6);
        break;
      case 2: schema["pattern"] = patterns[pick(patterns.size())]; break;
      default: schema["enum"] = {"alpha", "beta", "\xE2\x82\xAC", "a\\b"}; break;
    }
    return schema;
  }

  Schema integer_schema() {
    Schema schema{{"type", "integer"}};
    int low = pick(100) - 50, high = low + pick(60);
    if (pick(2)) schema[pick(2) ? "minimum" : "exclusiveMinimum"] = low;
    if (pick(2)) schema[pick(2) ? "maximum" : "exclusiveMaximum"] = high + 1;
    return schema;
  }

  Schema number_schema() {
    static const std::vector<double> values = {-12.5, -3, -0.25, 0, 0.125, 0.5, 1, 2.75, 10};
    Schema schema{{"type", "number"}};
    size_t low = pick(values.size()), high = low + 1 + pick(values.size() - low);
    if (pick(3)) schema[pick(2) ? "minimum" : "exclusiveMinimum"] = values[low];
    if (pick(3) && high < values.size()) schema[pick(2) ? "maximum" : "exclusiveMaximum"] = values[high];
    return schema;
  }

  Schema small_schema() {
    switch (pick(4)) {
      case 0: return Schema{{"type", "boolean"}};
      case 1: return Schema{{"type", "null"}};
      case 2: return Schema{{"type", {"string", "null"}}, {"maxLength", 3}};
      default: return Schema{{"type", {"integer", "boolean"}}, {"minimum", 3}};
    }
  }

  Schema array_schema(int depth) {
    Schema schema{{"type", "array"}};
    if (pick(4)) schema["items"] = generate(depth + 1);
    int min_items = pick(3);
    if (pick(2)) schema["minItems"] = min_items;
    if (pick(2)) schema["maxItems"] = min_items + pick(3);
    return schema;
  }

  Schema object_schema(int depth) {
    static const std::vector<std::string> names = {"a", "name", "x y", "caf\xC3\xA9", "quo\"te", "n", "list"};
    if (pick(5) == 0) {  // free-form
      Schema schema{{"type", "object"}};
      if (pick(2)) schema["additionalProperties"] = Schema{{"type", "integer"}};
      return schema;
    }
    Schema properties = Schema::object(), required = Schema::array();
    for (int i = 0, n = 1 + pick(4); i < n; ++i) {
      const std::string& name = names[pick(names.size())];
      if (properties.contains(name)) continue;
      properties[name] = generate(depth + 1);
      if (pick(2)) required.push_back(name);
    }
    return Schema{{"type", "object"}, {"properties", properties}, {"required", required}};
  }

  std::mt19937 rng_;
};

inline size_t code_points(const std::string& text) {
  size_t count = 0;
  for (unsigned char byte : text) count += (byte & 0xC0) != 0x80;
  return count;
}

inline bool has_type(const nlohmann::json& value, const std::string& type) {
  if (type == "null") return value.is_null();
  if (type == "boolean") return value.is_boolean();
  if (type == "integer") return value.is_number_integer();
  if (type == "number") return value.is_number();
  if (type == "string") return value.is_string();
  if (type == "array") return value.is_array();
  return value.is_object();
}

// Validates `value` against a schema of the generator's subset.
inline bool validate(const nlohmann::json& value, const Schema& schema) {
  if (schema.is_boolean()) return schema.get<bool>();
  if (schema.contains("anyOf")) {
    for (const Schema& branch : schema["anyOf"]) {
      if (validate(value, branch)) return true;
    }
    return false;
  }
  if (schema.contains("const")) return value == nlohmann::json::parse(schema["const"].dump());
  if (schema.contains("enum")) {
    bool listed = false;
    for (const Schema& option : schema["enum"]) listed |= value == nlohmann::json::parse(option.dump());
    if (!listed) return false;
  }
  if (schema.contains("type")) {
    bool typed = false;
    const Schema& type = schema["type"];
    if (type.is_string()) typed = has_type(value, type.get<std::string>());
    for (const Schema& name : type.is_array() ? type : Schema::array()) typed |= has_type(value, name.get<std::string>());
    if (!typed) return false;
  }
  if (value.is_number()) {
    double x = value.get<double>();
    if (schema.contains("minimum") && x < schema["minimum"].get<double>()) return false;
    if (schema.contains("maximum") && x > schema["maximum"].get<double>()) return false;
    if (schema.contains("exclusiveMinimum") && x <= schema["exclusiveMinimum"].get<double>()) return false;
    if (schema.contains("exclusiveMaximum") && x >= schema["exclusiveMaximum"].get<double>()) return false;
  }
  if (value.is_string()) {
    const std::string& text = value.get_ref<const std::string&>();
    if (schema.contains("minLength") && code_points(text) < schema["minLength"].get<size_t>()) return false;
    if (schema.contains("maxLength") && code_points(text) > schema["maxLength"].get<size_t>()) return false;
    if (schema.contains("pattern") && !std::regex_search(text, std::regex(schema["pattern"].get<std::string>()))) {
      return false;
    }
  }
  if (value.is_array()) {
    if (schema.contains("minItems") && value.size() < schema["minItems"].get<size_t>()) return false;
    if (schema.contains("maxItems") && value.size() > schema["maxItems"].get<size_t>()) return false;
    for (const nlohmann::json& item : value) {
      if (schema.contains("items") && !validate(item, schema["items"])) return false;
    }
  }
  if (value.is_object()) {
    const Schema properties = schema.contains("properties") ? schema["properties"] : Schema::object();
    for (const Schema& name : schema.contains("required") ? schema["required"] : Schema::array()) {
      if (!value.contains(name.get<std::string>())) return false;
    }
    for (const auto& [key, item] : value.items()) {
      if (properties.contains(key)) {
        if (!validate(item, properties[key])) return false;
      } else if (!properties.empty()) {
        return false;  // additionalProperties: false beside properties
      } else if (schema.contains("additionalProperties") && !validate(item, schema["additionalProperties"])) {
        return false;
      }
    }
  }
  return true;
}

struct Walk {
  std::string text;
  bool finished = false;
  bool dead_end = false;
};

// Picks uniformly among the allowed tokens until an end token (or max_steps).
inline Walk random_walk(TokenMatcher& matcher, const std::vector<std::string>& tokens, std::mt19937& rng,
                        int max_steps) {
  Walk walk;
  std::vector<int32_t> allowed;
  for (int step = 0; step < max_steps; ++step) {
    const TokenMask& mask = matcher.allowed_tokens();
    allowed.clear();
    for (size_t word = 0; word < mask.size(); ++word) {
      for (uint64_t bits = mask[word]; bits; bits &= bits - 1) {
        allowed.push_back(static_cast<int32_t>(word * 64 + __builtin_ctzll(bits)));
      }
    }
    if (allowed.empty()) {
      walk.dead_end = true;
      return walk;
    }
    int32_t token = allowed[rng() % allowed.size()];
    EXPECT_TRUE(matcher.accept_token(token));
    if (matcher.is_finished()) {
      walk.finished = true;
      return walk;
    }
    walk.text += tokens[token];
  }
  return walk;
}

// 256 single bytes, then random pieces (2 to 8 bytes) of JSON-ish text with escapes and multi-byte characters,
// which often end inside a character or span several JSON tokens; with long_tokens also tokens of 17 to 100 bytes
// (runs of spaces, dashes, letters and digits, and pieces of the text) that reach past any bound of a test's
// schemas. The last id is the end token (no bytes).
inline std::vector<std::string> synthetic_vocabulary(uint32_t seed, bool long_tokens = false) {
  const std::string corpus =
      R"({"name": "caf\u00e9", "a": [1, -2.5, true, null], "x y": {"n": 12e3}, "list": ["red", 7]})"
      "\"quo\\\"te\" \\\\ \\n yes no abc xyz 123-45 Hello \xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80 na\xC3\xAFve "
      "\"],\"}]},{\"[{\": 0.125, 10, 2.75, -12.5 alpha beta ababcab-xyz";
  std::vector<std::string> tokens;
  for (int byte = 0; byte < 256; ++byte) tokens.push_back(std::string(1, char(byte)));
  std::mt19937 rng(seed);
  for (int i = 0; i < 1500; ++i) {
    size_t length = 2 + rng() % 7, start = rng() % (corpus.size() - length);
    tokens.push_back(corpus.substr(start, length));
  }
  if (long_tokens) {
    for (size_t length : {17, 20, 31, 40, 64, 79, 80, 81, 100}) {
      for (char fill : {' ', '-', 'a', '7'}) tokens.push_back(std::string(length, fill));
      tokens.push_back(corpus.substr(rng() % (corpus.size() - length), length));
    }
  }
  tokens.push_back("");
  return tokens;
}

}  // namespace strata::grammar::test
