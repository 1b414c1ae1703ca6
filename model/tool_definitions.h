#pragma once
// The function tools a chat request offers the model (OpenAI's `tools`), and their reading from the request's JSON.
#include <nlohmann/json.hpp>

#include <span>
#include <string>
#include <vector>

namespace strata {

// One entry of `tools`: {"type": "function", "function": {"name", "description"?, "parameters"?, "strict"?}}.
struct ToolDefinition {
  std::string name;
  std::string description;             // empty when the client gave none
  nlohmann::ordered_json parameters;   // the arguments' JSON Schema (an object); null when the client gave none
  bool strict = false;                 // OpenAI's `strict`; a forced call is constrained to the schema either way
};

// Reads an OpenAI `tools` array. Throws FieldError (model/json_field.h) naming the field at fault
// ("tools[1].function.name"): not an array, an entry that is not a function tool, a missing or
// malformed name (OpenAI's rule: 1 to 64 of a-z A-Z 0-9 _ -), a name given twice, parameters that are not an
// object, an unknown key. The ordered_json overload keeps the client's key order in `parameters` (the order in
// which the prompt lists, and a constrained call writes, the arguments); the other sorts the keys.
std::vector<ToolDefinition> parse_tool_definitions(const nlohmann::ordered_json& tools);
std::vector<ToolDefinition> parse_tool_definitions(const nlohmann::json& tools);

// Checks what render and the call schema rely on, for definitions built in code: names as above and unique,
// parameters an object or null. Throws FieldError naming "tools[i].function.<field>".
void check_tool_definitions(std::span<const ToolDefinition> tools);

// OpenAI's form of one tool, {"type": "function", "function": {"name", "description", "parameters"}}, as the chat
// templates list it (description and parameters left out when absent).
nlohmann::ordered_json openai_tool_json(const ToolDefinition& tool);

// The JSON Schema of a call's arguments: the tool's parameters, or an object with no properties when it has none
// (OpenAI: "omitting parameters defines a function with an empty parameter list").
nlohmann::ordered_json arguments_schema(const ToolDefinition& tool);

}  // namespace strata
