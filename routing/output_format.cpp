#include "routing/output_format.h"

#include <algorithm>

#include "grammar/json_schema.h"
#include "model/json_field.h"
#include "routing/api_error.h"
#include "routing/openai_protocol.h"

namespace strata {
namespace {

// response_format: {"type": "text"} | {"type": "json_object"} |
// {"type": "json_schema", "json_schema": {"name", "description"?, "schema"?, "strict"?}}.
void parse_response_format(const RequestJson& root, OutputFormat& format) {
  const RequestJson* value = find_field(root, "response_format");
  if (!value) return;
  if (!value->is_object()) throw_type("response_format", "an object", *value);
  const RequestJson* type = find_field(*value, "type");
  if (!type) throw_required("response_format.type");
  const std::string& kind = read_string(*type, "response_format.type");
  const std::vector<std::string> allowed_keys =
      kind == "json_schema" ? std::vector<std::string>{"type", "json_schema"} : std::vector<std::string>{"type"};
  for (const auto& [key, _] : value->items()) {
    if (std::find(allowed_keys.begin(), allowed_keys.end(), key) == allowed_keys.end()) {
      throw ApiError::invalid_request("response_format." + key, "unknown field 'response_format." + key + "'");
    }
  }
  if (kind == "text") return;
  if (kind == "json_object") {
    format.json_schema = RequestJson{{"type", "object"}};
    format.schema_param = "response_format";
    return;
  }
  if (kind != "json_schema") {
    throw ApiError::invalid_request("response_format.type", "response_format type '" + kind +
                                                                "' is not supported; use text, json_object or json_schema");
  }
  const RequestJson* spec = find_field(*value, "json_schema");
  if (!spec) throw_required("response_format.json_schema");
  if (!spec->is_object()) throw_type("response_format.json_schema", "an object", *spec);
  for (const auto& [key, field] : spec->items()) {
    const std::string param = "response_format.json_schema." + key;
    if (key == "name" || key == "description") {
      read_string(field, param);
    } else if (key == "strict") {
      if (!field.is_null()) read_bool(field, param);  // strict or not, the answer is decoded under the schema
    } else if (key != "schema") {
      throw ApiError::invalid_request(param, "unknown field " + quoted(param));
    }
  }
  if (!find_field(*spec, "name")) throw_required("response_format.json_schema.name");
  const RequestJson* schema = find_field(*spec, "schema");
  format.json_schema = schema ? *schema : RequestJson::object();  // OpenAI: no schema, any JSON value
  format.schema_param = "response_format.json_schema.schema";
}

// tool_choice: "none" | "auto" | "required" | {"type": "function", "function": {"name": NAME}}.
void parse_tool_choice(const RequestJson& root, OutputFormat& format) {
  const RequestJson* value = find_field(root, "tool_choice");
  if (!value) {
    format.tool_choice = format.tools.empty() ? ToolChoice::none : ToolChoice::automatic;  // OpenAI's default
    return;
  }
  if (value->is_string()) {
    const std::string& choice = value->get_ref<const std::string&>();
    if (choice == "none") format.tool_choice = ToolChoice::none;
    else if (choice == "auto") format.tool_choice = ToolChoice::automatic;
    else if (choice == "required") format.tool_choice = ToolChoice::required;
    else throw ApiError::invalid_request("tool_choice", "tool_choice '" + choice + "' is not one of none, auto, required");
  } else if (value->is_object()) {
    const RequestJson* type = find_field(*value, "type");
    if (!type || read_string(*type, "tool_choice.type") != "function") {
      throw ApiError::invalid_request("tool_choice.type", "'tool_choice.type' must be 'function'");
    }
    const RequestJson* function = find_field(*value, "function");
    if (!function || !function->is_object()) throw_type("tool_choice.function", "an object", function ? *function : RequestJson());
    const RequestJson* name = find_field(*function, "name");
    if (!name) throw_required("tool_choice.function.name");
    format.named_tool = read_string(*name, "tool_choice.function.name");
    format.tool_choice = ToolChoice::named;
  } else {
    throw_type("tool_choice", "a string or an object", *value);
  }
  if (format.tool_choice == ToolChoice::none) return;
  if (format.tools.empty()) {
    throw ApiError::invalid_request("tool_choice", "tool_choice asks for a tool call, but 'tools' offers none");
  }
  if (format.tool_choice == ToolChoice::named &&
      std::none_of(format.tools.begin(), format.tools.end(), [&](const ToolDefinition& t) { return t.name == format.named_tool; })) {
    throw ApiError::invalid_request("tool_choice.function.name",
                                    "tool_choice names '" + format.named_tool + "', which 'tools' does not offer");
  }
}

void parse_tools(const RequestJson& root, OutputFormat& format) {
  if (const RequestJson* tools = find_field(root, "tools")) {
    try {
      format.tools = parse_tool_definitions(*tools);
    } catch (const FieldError& e) {
      throw ApiError::invalid_request(e.field(), e.what());
    }
  }
  parse_tool_choice(root, format);
  if (const RequestJson* parallel = find_field(root, "parallel_tool_calls")) {
    format.parallel_tool_calls = read_bool(*parallel, "parallel_tool_calls");
  }
}

}  // namespace

std::vector<ToolDefinition> OutputFormat::prompt_tools() const {
  if (tool_choice == ToolChoice::none) return {};
  if (tool_choice != ToolChoice::named) return tools;
  std::vector<ToolDefinition> named;
  std::copy_if(tools.begin(), tools.end(), std::back_inserter(named),
               [&](const ToolDefinition& t) { return t.name == named_tool; });
  return named;
}

std::optional<OutputFormat::Constraint> OutputFormat::constraint(const ToolCallSyntax& syntax) const {
  if (json_schema) return Constraint{*json_schema, schema_param, "", ""};
  if (tool_choice != ToolChoice::required && tool_choice != ToolChoice::named) return std::nullopt;
  const std::vector<ToolDefinition> offered = prompt_tools();
  return Constraint{syntax.call_schema(offered), "tools", syntax.prefix, syntax.suffix};
}

namespace {

std::shared_ptr<const grammar::Grammar> compile_schema(const RequestJson& schema, const std::string& param) {
  try {
    return grammar::compile_json_schema(schema, grammar::SchemaOptions{grammar::JsonStyle{}, param});
  } catch (const grammar::SchemaError& e) {
    throw ApiError::invalid_request(param + e.pointer(), e.what());
  }
}

}  // namespace

std::shared_ptr<const grammar::Grammar> output_grammar(const OutputFormat& format, const ToolCallSyntax& syntax) {
  const std::optional<OutputFormat::Constraint> constraint = format.constraint(syntax);
  if (!constraint) return nullptr;
  // Each tool's parameters alone first, so that an error names the tool rather than a branch of the call schema.
  const std::vector<ToolDefinition> offered = format.prompt_tools();
  for (size_t i = 0; i < format.tools.size() && !format.json_schema; ++i) {
    const ToolDefinition& tool = format.tools[i];
    if (std::none_of(offered.begin(), offered.end(), [&](const ToolDefinition& t) { return t.name == tool.name; })) {
      continue;
    }
    compile_schema(arguments_schema(tool), "tools[" + std::to_string(i) + "].function.parameters");
  }
  const std::shared_ptr<const grammar::Grammar> document = compile_schema(constraint->schema, constraint->param);
  if (constraint->prefix.empty() && constraint->suffix.empty()) return document;
  return grammar::surround(*document, constraint->prefix, constraint->suffix);
}

OutputFormat parse_output_format(const RequestJson& root, ApiDialect dialect) {
  OutputFormat format;
  parse_response_format(root, format);
  if (dialect != ApiDialect::chat) return format;  // request_fields refuses tools outside chat
  parse_tools(root, format);
  if (format.json_schema && format.tool_choice != ToolChoice::none) {
    throw ApiError::invalid_request("response_format",
                                    "a response_format other than text together with tools is not implemented; "
                                    "set tool_choice to 'none', or leave response_format out");
  }
  return format;
}

}  // namespace strata
