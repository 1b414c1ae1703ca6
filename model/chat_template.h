#pragma once
// Chat templates rendered in C++ (no Jinja): ChatML (SmolLM2, with its default system prompt), Llama 3, Mistral;
// with function tools, each in its family's format (docs/tool-calls.md).
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/tool_definitions.h"

namespace strata {

// One call an assistant message made (OpenAI's message.tool_calls[i]).
struct ToolCall {
  std::string id;         // tool_calls[i].id, which the tool message answering it repeats
  std::string name;       // tool_calls[i].function.name
  std::string arguments;  // tool_calls[i].function.arguments: the JSON text as the client sent it
};

struct ChatMessage {
  std::string role;     // "system", "user", "assistant", "tool"
  std::string content;  // may be empty on an assistant message that only calls tools
  std::vector<ToolCall> tool_calls = {};  // assistant only
  std::string tool_call_id = {};          // tool only: the id of the call this message gives the result of
  std::string name = {};                  // tool only, optional: the function's name (no template renders it)
};

enum class ChatTemplateKind { chatml, llama3, mistral };

// A call the model wrote, read back by ChatTemplate::parse_tool_calls.
struct ParsedToolCall {
  std::string name;
  std::string arguments;  // a JSON object, re-serialised compactly ({"city":"Paris"}), keys in the model's order
};

// How several calls follow one another in one answer.
enum class ToolCallRepetition {
  single,      // one call per answer (Llama 3)
  list_items,  // the calls are items of one JSON array: prefix call separator call ... suffix (Mistral)
  blocks,      // whole blocks: prefix call suffix separator prefix call suffix ... (ChatML)
};

// What the model writes to call a function. One call is exactly
//   prefix + {"name": "<function>", "<arguments_key>": {...the arguments...}} + suffix
// which is what a forced call (tool_choice "required" or a named function) is constrained to: call_schema gives
// the JSON object's schema. Several calls are joined as `repetition` says.
//   chatml  prefix "<tool_call>\n"    suffix "\n</tool_call>"  arguments_key "arguments"   blocks, separator "\n"
//   llama3  prefix ""                 suffix ""                arguments_key "parameters"  single
//   mistral prefix "[TOOL_CALLS] ["   suffix "]"               arguments_key "arguments"   list_items, ", "
// Mistral's "[TOOL_CALLS]" is a special token of its v3 vocabulary; the others' markers are plain text.
struct ToolCallSyntax {
  std::string prefix;
  std::string suffix;
  std::string arguments_key;
  ToolCallRepetition repetition = ToolCallRepetition::single;
  std::string separator;  // between two calls (list_items, blocks); empty for single

  // The JSON Schema of the object of one call of one of `tools` (several: anyOf, one branch per tool):
  // {"type": "object", "properties": {"name": {"const": NAME}, ARGUMENTS_KEY: <the tool's parameters>},
  //  "required": ["name", ARGUMENTS_KEY], "additionalProperties": false}, "name" listed first. Throws
  // FieldError (model/json_field.h) naming "tools" for no tools.
  nlohmann::ordered_json call_schema(std::span<const ToolDefinition> tools) const;
};

class ChatTemplate {
 public:
  ChatTemplate(ChatTemplateKind kind, std::string default_system_prompt = "");
  // "chatml" | "llama3" | "mistral"; throws std::invalid_argument naming the value otherwise.
  static ChatTemplate from_name(std::string_view name, std::string default_system_prompt = "");
  // Picks the template by looking at a model's Jinja template text (GGUF tokenizer.chat_template).
  static ChatTemplate detect(std::string_view jinja_template);

  // The prompt text; it contains special-token strings and is meant to be encoded with parse_special = true.
  // `tools` are listed where the family puts them (none: the prompt is what it was before tools existed); tool
  // calls and tool results in `messages` are rendered in the family's format. Throws FieldError
  // (model/json_field.h) naming the field at fault ("messages[2].tool_calls[0].function.arguments: not valid JSON",
  // "tools[0].function.name: required"), for an unknown role, a malformed tool call or tool message, or an order
  // the template cannot express.
  std::string render(std::span<const ChatMessage> messages, std::span<const ToolDefinition> tools,
                     bool add_generation_prompt) const;
  std::string render(std::span<const ChatMessage> messages, bool add_generation_prompt) const {
    return render(messages, {}, add_generation_prompt);
  }

  ToolCallSyntax tool_call_syntax() const;
  // The calls in `text` (the model's whole answer), when it is nothing but calls in tool_call_syntax(): whitespace
  // around the text and between the syntax's pieces is ignored, anything else must match; every call needs a
  // non-empty string "name" and an object of arguments, and no other key (Mistral's may carry the "id" it sees
  // in the prompt's earlier calls). nullopt otherwise: the text is ordinary content. Names are not checked
  // against the request's tools.
  std::optional<std::vector<ParsedToolCall>> parse_tool_calls(std::string_view text) const;

  ChatTemplateKind kind() const { return kind_; }

 private:
  ChatTemplateKind kind_;
  std::string default_system_prompt_;
};

// SmolLM2's default system prompt (no final period, as the model's template has it).
inline constexpr std::string_view kSmolLm2SystemPrompt =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

}  // namespace strata
