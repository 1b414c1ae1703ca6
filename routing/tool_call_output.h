#pragma once
// A chat answer read back as tool calls, when the request offered tools and tool_choice is not "none": the answer
// that is nothing but calls of offered tools, in the template's syntax (model/chat_template.h), comes back as
// message.tool_calls with finish_reason "tool_calls"; any other answer is content. A stream holds an answer's
// text back while it may still become a call, and sends the calls whole when the choice ends
// (docs/structured-output.md).
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/chat_template.h"

namespace strata {

class ToolCallReader {
 public:
  // The template must outlive the reader (it is the server's).
  ToolCallReader(const ChatTemplate& chat_template, std::vector<std::string> tool_names);

  // The calls when `text` is nothing but calls of the offered tools; nullopt otherwise.
  std::optional<std::vector<ParsedToolCall>> read(std::string_view text) const;
  // Whether `text`, the beginning of an answer, may still become a call (a stream holds it back meanwhile).
  bool may_become_call(std::string_view text) const;

 private:
  const ChatTemplate* chat_template_;
  std::string prefix_;  // what a call starts with; empty: its JSON object's "{"
  std::vector<std::string> tool_names_;
};

// OpenAI's message.tool_calls (streamed: delta.tool_calls, with each call's index): ids "call_<24 hex>".
nlohmann::ordered_json tool_calls_json(const std::vector<ParsedToolCall>& calls, bool with_index);

}  // namespace strata
