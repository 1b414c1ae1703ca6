#include "model/tool_definitions.h"

#include <set>

#include "model/json_field.h"

namespace strata {

namespace {

using json_field::read_bool;
using json_field::read_string;

void check_function_name(const std::string& name, const std::string& field) {
  if (name.empty()) throw_field(field, "required");
  if (name.size() > 64) throw_field(field, "longer than 64 characters");
  for (char c : name) {
    const bool allowed = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                         c == '-';
    if (!allowed) throw_field(field, "\"" + name + "\" may hold only a-z, A-Z, 0-9, _ and -");
  }
}

template <class Json>
ToolDefinition read_function(const Json& function, const std::string& param) {
  if (!function.is_object()) throw FieldError::wrong_type(param, "an object", function);
  ToolDefinition tool;
  for (const auto& [key, value] : function.items()) {
    const std::string field = param + "." + key;
    if (value.is_null() && key != "name") continue;  // an optional field given as null is absent
    if (key == "name") {
      tool.name = read_string(value, field);
    } else if (key == "description") {
      tool.description = read_string(value, field);
    } else if (key == "parameters") {
      if (!value.is_object()) throw FieldError::wrong_type(field, "a JSON Schema object", value);
      tool.parameters = nlohmann::ordered_json(value);
    } else if (key == "strict") {
      tool.strict = read_bool(value, field);
    } else {
      throw_field(field, "unknown field");
    }
  }
  if (!function.contains("name")) throw_field(param + ".name", "required");
  return tool;
}

template <class Json>
std::vector<ToolDefinition> read_tools(const Json& tools) {
  if (!tools.is_array()) throw FieldError::wrong_type("tools", "an array", tools);
  std::vector<ToolDefinition> out;
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& tool = tools[i];
    const std::string param = "tools[" + std::to_string(i) + "]";
    if (!tool.is_object()) throw FieldError::wrong_type(param, "an object", tool);
    for (const auto& [key, value] : tool.items()) {
      if (key != "type" && key != "function") throw_field(param + "." + key, "unknown field");
    }
    if (!tool.contains("type")) throw_field(param + ".type", "required");
    const std::string type = read_string(tool["type"], param + ".type");
    if (type != "function") throw_field(param + ".type", "\"" + type + "\" is not supported; only \"function\" is");
    if (!tool.contains("function")) throw_field(param + ".function", "required");
    out.push_back(read_function(tool["function"], param + ".function"));
  }
  check_tool_definitions(out);
  return out;
}

}  // namespace

std::vector<ToolDefinition> parse_tool_definitions(const nlohmann::ordered_json& tools) { return read_tools(tools); }

std::vector<ToolDefinition> parse_tool_definitions(const nlohmann::json& tools) { return read_tools(tools); }

void check_tool_definitions(std::span<const ToolDefinition> tools) {
  std::set<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string param = "tools[" + std::to_string(i) + "].function";
    check_function_name(tools[i].name, param + ".name");
    if (!names.insert(tools[i].name).second) {
      throw_field(param + ".name", "\"" + tools[i].name + "\" is defined twice");
    }
    if (!tools[i].parameters.is_null() && !tools[i].parameters.is_object()) {
      throw_field(param + ".parameters", "must be a JSON Schema object");
    }
  }
}

nlohmann::ordered_json openai_tool_json(const ToolDefinition& tool) {
  nlohmann::ordered_json function = {{"name", tool.name}};
  if (!tool.description.empty()) function["description"] = tool.description;
  if (!tool.parameters.is_null()) function["parameters"] = tool.parameters;
  return {{"type", "function"}, {"function", std::move(function)}};
}

nlohmann::ordered_json arguments_schema(const ToolDefinition& tool) {
  if (!tool.parameters.is_null()) return tool.parameters;
  return {{"type", "object"}, {"properties", nlohmann::ordered_json::object()}};
}

}  // namespace strata
