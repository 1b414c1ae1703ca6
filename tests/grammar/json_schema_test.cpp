// The schema compiler on hand-written cases: each keyword's accepted and refused texts, strings (escapes,
// UTF-8), objects (order, required, optional), arrays, anyOf, whitespace, and the errors with their pointers.
#include "grammar/json_schema.h"

#include <gtest/gtest.h>

#include "tests/grammar/grammar_test_util.h"

namespace strata::grammar {
namespace {

using test::matches;
using test::schema_error;
using test::schema_grammar;
using test::viable;

TEST(JsonSchema, Scalars) {
  auto null_or_bool = schema_grammar(R"({"type": ["null", "boolean"]})");
  EXPECT_TRUE(matches(null_or_bool, "null"));
  EXPECT_TRUE(matches(null_or_bool, "true"));
  EXPECT_TRUE(matches(null_or_bool, "false"));
  EXPECT_FALSE(matches(null_or_bool, "nul"));
  EXPECT_FALSE(matches(null_or_bool, "1"));
  auto integer = schema_grammar(R"({"type": "integer"})");
  for (const char* good : {"0", "-1", "42", "123456789012345678", "-7"}) EXPECT_TRUE(matches(integer, good)) << good;
  for (const char* bad : {"01", "-0", "1.5", "+1", "1e3", "-", "1234567890123456789"}) {
    EXPECT_FALSE(matches(integer, bad)) << bad;
  }
  auto number = schema_grammar(R"({"type": "number"})");
  for (const char* good : {"0", "-0", "0.5", "-12.25", "1e5", "1E-5", "2.5e+10"}) {
    EXPECT_TRUE(matches(number, good)) << good;
  }
  for (const char* bad : {"01", ".5", "1.", "1e", "1e+", "--1", "1e123"}) EXPECT_FALSE(matches(number, bad)) << bad;
}

TEST(JsonSchema, StringsWithEscapesAndUnicode) {
  auto string = schema_grammar(R"({"type": "string"})");
  for (const char* good : {R"("")", R"("plain")", R"("q\"uote")", R"("back\\slash")", R"("\n\t\r\b\f\/")",
                           R"("\u00e9\u20AC")", "\"caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80\""}) {
    EXPECT_TRUE(matches(string, good)) << good;
  }
  for (const char* bad : {R"(")", R"("a"b")", R"("\x")", R"("\u12")", R"("\ud800")", R"("\uDC00")", "\"a\nb\"",
                          "\"\xC3\"", "\"\xC0\xAF\"", "\"\xED\xA0\x80\"", "\"\xF4\x90\x80\x80\"", "\"\xFF\""}) {
    EXPECT_FALSE(matches(string, bad)) << bad;
  }
  // A prefix that ends inside a UTF-8 character is viable; a broken continuation is not.
  EXPECT_TRUE(viable(string, "\"\xE2\x82"));
  EXPECT_FALSE(viable(string, "\"\xE2\x41"));
  EXPECT_TRUE(viable(string, "\"\\u00"));
}

TEST(JsonSchema, StringLengthCountsCodePoints) {
  auto string = schema_grammar(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  EXPECT_FALSE(matches(string, R"("a")"));
  EXPECT_TRUE(matches(string, R"("ab")"));
  EXPECT_TRUE(matches(string, "\"\xE2\x82\xAC\xC3\xA9\\n\""));  // three characters, eight bytes
  EXPECT_FALSE(matches(string, R"("abcd")"));
  EXPECT_FALSE(viable(string, R"("abcd)"));
}

TEST(JsonSchema, ObjectsInSchemaOrderWithRequiredAndOptional) {
  auto person = schema_grammar(R"({"type": "object", "properties": {
      "name": {"type": "string"}, "age": {"type": "integer"}, "email": {"type": "string"}},
      "required": ["name", "email"]})");
  EXPECT_TRUE(matches(person, R"({"name":"Ann","age":3,"email":"a@b"})"));
  EXPECT_TRUE(matches(person, R"({"name":"Ann","email":"a@b"})"));
  EXPECT_FALSE(matches(person, R"({"name":"Ann","age":3})")) << "email is required";
  EXPECT_FALSE(matches(person, R"({"age":3,"name":"Ann","email":"a@b"})")) << "schema order";
  EXPECT_FALSE(matches(person, R"({"name":"Ann","email":"a@b","extra":1})")) << "no additional properties";
  EXPECT_FALSE(matches(person, R"({"name":"Ann",,"email":"a@b"})"));
  EXPECT_FALSE(matches(person, R"({"name":"Ann","email":"a@b",})"));
  auto all_optional = schema_grammar(R"({"properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}})");
  for (const char* good : {"{}", R"({"a":1})", R"({"b":2})", R"({"a":1,"b":2})"}) {
    EXPECT_TRUE(matches(all_optional, good)) << good;
  }
  EXPECT_FALSE(matches(all_optional, R"({,"b":2})"));
}

TEST(JsonSchema, NestedObjectsAndArrays) {
  auto schema = schema_grammar(R"({"type": "object", "properties": {
      "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2},
      "point": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}},
      "required": ["tags", "point"]})");
  EXPECT_TRUE(matches(schema, R"({"tags":["a"],"point":{"x":1.5}})"));
  EXPECT_TRUE(matches(schema, R"({"tags":["a","b"],"point":{"x":-2}})"));
  EXPECT_FALSE(matches(schema, R"({"tags":[],"point":{"x":1}})"));
  EXPECT_FALSE(matches(schema, R"({"tags":["a","b","c"],"point":{"x":1}})"));
  EXPECT_FALSE(matches(schema, R"({"tags":["a"],"point":{}})"));
  auto empty_array = schema_grammar(R"({"type": "array", "maxItems": 0})");
  EXPECT_TRUE(matches(empty_array, "[]"));
  EXPECT_FALSE(matches(empty_array, "[1]"));
  auto any_items = schema_grammar(R"({"type": "array"})");
  EXPECT_TRUE(matches(any_items, R"([1,"x",{"k":[true,null]},[]])"));
}

TEST(JsonSchema, EnumConstAndAnyOf) {
  auto colour = schema_grammar(R"({"enum": ["red", "green", 3, null, {"b": 1, "a": [2]}]})");
  for (const char* good : {R"("red")", R"("green")", "3", "null", R"({"b":1,"a":[2]})"}) {
    EXPECT_TRUE(matches(colour, good)) << good;
  }
  EXPECT_FALSE(matches(colour, R"("gre")"));
  EXPECT_FALSE(matches(colour, R"("blue")"));
  auto typed_enum = schema_grammar(R"({"type": "string", "enum": ["a", 1]})");
  EXPECT_TRUE(matches(typed_enum, R"("a")"));
  EXPECT_FALSE(matches(typed_enum, "1"));
  auto constant = schema_grammar(R"({"const": "fixed"})");
  EXPECT_TRUE(matches(constant, R"("fixed")"));
  EXPECT_FALSE(matches(constant, R"("fixe")"));
  auto either = schema_grammar(R"({"anyOf": [
      {"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}}, "required": ["kind", "x"]},
      {"type": "object", "properties": {"kind": {"const": "b"}, "y": {"type": "string"}}, "required": ["kind", "y"]},
      {"type": "integer", "minimum": 5}]})");
  EXPECT_TRUE(matches(either, R"({"kind":"a","x":1})"));
  EXPECT_TRUE(matches(either, R"({"kind":"b","y":"s"})"));
  EXPECT_FALSE(matches(either, R"({"kind":"a","y":"s"})"));
  EXPECT_TRUE(matches(either, "7"));
  EXPECT_FALSE(matches(either, "4"));
}

TEST(JsonSchema, FreeObjectsAndBooleanSchemas) {
  auto object = any_json_object_grammar();
  auto free = std::make_shared<const Grammar>(*object);
  EXPECT_TRUE(matches(free, "{}"));
  EXPECT_TRUE(matches(free, R"({"a":{"b":[1,2,{"c":null}]},"d":"\u00e9"})"));
  EXPECT_FALSE(matches(free, "[]"));
  EXPECT_FALSE(matches(free, R"({"a"})"));
  auto typed_values = schema_grammar(R"({"type": "object", "additionalProperties": {"type": "integer"}})");
  EXPECT_TRUE(matches(typed_values, R"({"a":1,"b":2})"));
  EXPECT_FALSE(matches(typed_values, R"({"a":"x"})"));
  auto closed = schema_grammar(R"({"type": "object", "additionalProperties": false})");
  EXPECT_TRUE(matches(closed, "{}"));
  EXPECT_FALSE(matches(closed, R"({"a":1})"));
  auto anything = schema_grammar("true");
  EXPECT_TRUE(matches(anything, R"([1,{"a":"b"}])"));
  EXPECT_TRUE(matches(anything, "-1.5e3"));
}

TEST(JsonSchema, BoundedWhitespace) {
  JsonStyle style;
  style.max_whitespace = 2;
  auto schema = schema_grammar(R"({"type": "object", "properties": {"a": {"type": "array"}}, "required": ["a"]})",
                               style);
  EXPECT_TRUE(matches(schema, R"({"a":[]})"));
  EXPECT_TRUE(matches(schema, "{ \"a\" :  [ 1 , 2 ] }"));
  EXPECT_TRUE(matches(schema, "{\n \"a\": [\n {\"k\": 1}]\n}"));
  EXPECT_FALSE(matches(schema, "{   \"a\":[]}")) << "three blanks where two are allowed";
  EXPECT_FALSE(matches(schema, " {\"a\":[]}")) << "nothing before the value";
  EXPECT_FALSE(matches(schema_grammar(R"({"type": "array"})"), "[ ]")) << "compact by default";
}

TEST(JsonSchema, ErrorsNameTheJsonPointer) {
  EXPECT_EQ(schema_error(R"({"properties": {"age": {"type": "integer", "minimum": "3"}}})",
                         "response_format.json_schema.schema"),
            "response_format.json_schema.schema/properties/age/minimum: must be a number");
  EXPECT_EQ(schema_error(R"({"type": "strin"})"), "/type: unknown type \"strin\"");
  EXPECT_EQ(schema_error(R"({"$ref": "#/$defs/a"})"),
            "/$ref: references ($ref, $defs) are not supported: inline the schema");
  EXPECT_EQ(schema_error(R"({"properties": {"a/b": {"oneOf": []}}})"),
            "/properties/a~1b/oneOf: oneOf is not supported (anyOf is)");
  EXPECT_EQ(schema_error(R"({"type": "string", "format": "date"})"), "/format: format is not supported: use pattern");
  EXPECT_EQ(schema_error(R"({"type": "string", "frobnicate": 1})"), "/frobnicate: unknown keyword");
  EXPECT_EQ(schema_error(R"({"properties": {"a": {}}, "required": ["a", "b"]})"),
            "/required/1: names a property that properties does not define");
  EXPECT_EQ(schema_error(R"({"type": "array", "minItems": 3, "maxItems": 2})"), "/maxItems: is less than minItems");
  EXPECT_EQ(schema_error(R"({"type": "array", "minItems": -1})"), "/minItems: must be a non-negative integer");
  EXPECT_EQ(schema_error(R"({"type": "integer", "minimum": 1.5, "maximum": 1.7})"),
            "schema: no integer lies within the bounds");
  EXPECT_EQ(schema_error(R"json({"anyOf": [{"type": "string"}, {"type": "string", "pattern": "(?=a)"}]})json"),
            "/anyOf/1/pattern: pattern (?=a): lookaround and named groups are not supported at offset 2");
  EXPECT_EQ(schema_error(R"({"enum": [1, 2], "type": "string"})"), "/enum: no value has the schema's type");
  EXPECT_EQ(schema_error(R"({"enum": [1], "minimum": 0})"), "/minimum: cannot be combined with enum or const (only type can)");
  EXPECT_EQ(schema_error(R"({"type": "object", "anyOf": [true]})"), "/type: cannot be combined with anyOf: put it in each branch");
  EXPECT_EQ(schema_error(R"({"properties": {"a": {}}, "additionalProperties": true})"),
            "/additionalProperties: only false is supported beside properties");
  EXPECT_EQ(schema_error("false"), "schema: the schema false admits no value");
  EXPECT_EQ(schema_error("[1]"), "schema: must be an object or a boolean");
  EXPECT_EQ(schema_error(R"({"type": "number", "maximum": 1e300})"),
            "/maximum: must be a finite number of magnitude below 1e18");
  EXPECT_EQ(schema_error(R"({"type": "string", "uniqueItems": false, "title": "t", "description": "d"})"), "");
}

// A forced tool call: the schema's document between the template's literal prefix and suffix, nothing else.
TEST(Surround, PutsTheDocumentBetweenTwoLiterals) {
  const auto object = schema_grammar(R"({"type": "object", "properties": {"a": {"type": "integer"}},
                                               "required": ["a"]})");
  const auto call = surround(*object, "<tool_call>\n", "\n</tool_call>");
  EXPECT_TRUE(matches(call, "<tool_call>\n{\"a\":12}\n</tool_call>"));
  EXPECT_FALSE(matches(call, "{\"a\":12}"));
  EXPECT_FALSE(matches(call, "<tool_call>\n{\"a\":12}"));
  EXPECT_FALSE(viable(call, "<tool_call>{"));
  EXPECT_TRUE(matches(surround(*object, "", ""), "{\"a\":1}"));
  EXPECT_TRUE(matches(surround(*object, "[", "]"), "[{\"a\":1}]"));
}

}  // namespace
}  // namespace strata::grammar
