#pragma once
// What a request asks of the form of its output, validated: OpenAI's response_format (both dialects; the
// completions dialect takes it as vLLM does) and, in chat, tools, tool_choice and parallel_tool_calls. A format
// that constrains the output becomes the schema its choices are decoded under (grammar/json_schema.h), so that
// what the model writes always parses: JSON mode, a JSON Schema, or a forced tool call (docs/structured-output.md).
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "model/chat_template.h"
#include "model/tool_definitions.h"
#include "routing/json_fields.h"

namespace strata {

enum class ApiDialect;

enum class ToolChoice {
  none,       // no tool: the tools are not shown to the model (an earlier call in the messages still is)
  automatic,  // "auto": the model decides; an answer that is a call in the template's syntax comes back as calls
  required,   // one call of one of the tools, constrained
  named,      // one call of `named_tool`, constrained
};

struct OutputFormat {
  // response_format json_object / json_schema: the schema of the whole answer (json_object: any object).
  std::optional<RequestJson> json_schema;
  std::string schema_param;  // the field that holds it, for the errors of its compilation
  std::vector<ToolDefinition> tools;
  ToolChoice tool_choice = ToolChoice::none;
  std::string named_tool;
  bool parallel_tool_calls = true;  // accepted as given; a constrained answer is one call

  // Whether an answer may be read back as tool calls (routing/tool_call_output.h).
  bool answers_with_tools() const { return tool_choice != ToolChoice::none; }
  // The tools shown to the model in the prompt.
  std::vector<ToolDefinition> prompt_tools() const;
  // The schema the choices are decoded under, with the text around it (a forced call's prefix and suffix), or
  // nullopt when the output is free.
  struct Constraint {
    RequestJson schema;
    std::string param;   // the field an error in the schema is reported against
    std::string prefix;  // literal text before the JSON value
    std::string suffix;  // and after it
  };
  std::optional<Constraint> constraint(const ToolCallSyntax& syntax) const;
};

// Reads response_format, tools, tool_choice and parallel_tool_calls from a request body. Throws ApiError (400
// naming the field) for a malformed value, a tool_choice that names no offered tool, tools with a
// response_format that constrains, and tools outside the chat dialect.
OutputFormat parse_output_format(const RequestJson& root, ApiDialect dialect);

// The grammar the request's choices are decoded under (grammar/json_schema.h), or null when the output is free.
// Throws ApiError (400) naming the schema's field and the part of it that the compiler refuses
// ("tools[0].function.parameters/properties/unit: ...").
std::shared_ptr<const grammar::Grammar> output_grammar(const OutputFormat& format, const ToolCallSyntax& syntax);

}  // namespace strata
