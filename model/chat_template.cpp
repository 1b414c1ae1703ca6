#include "model/chat_template.h"

#include <stdexcept>

#include "model/json_field.h"

namespace strata {

namespace {

using OrderedJson = nlohmann::ordered_json;

std::string message_param(size_t index) { return "messages[" + std::to_string(index) + "]"; }

// Jinja's trim, which the Llama 3 template applies to every message.
std::string_view trim(std::string_view text) {
  constexpr std::string_view kSpace = " \t\n\r\f\v";
  const size_t first = text.find_first_not_of(kSpace);
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(kSpace) - first + 1);
}

// ---- Checks shared by every template --------------------------------------------------------------------------

void check_role(const ChatMessage& message, const std::string& param) {
  if (message.role != "system" && message.role != "user" && message.role != "assistant" && message.role != "tool") {
    throw_field(param + ".role",
                "unknown chat role \"" + message.role + "\" (expected system, user, assistant or tool)");
  }
}

void check_tool_calls(const ChatMessage& message, const std::string& param) {
  if (!message.tool_calls.empty() && message.role != "assistant") {
    throw_field(param + ".tool_calls", "only an assistant message carries tool calls");
  }
  for (size_t j = 0; j < message.tool_calls.size(); ++j) {
    const ToolCall& call = message.tool_calls[j];
    const std::string call_param = param + ".tool_calls[" + std::to_string(j) + "]";
    if (call.id.empty()) throw_field(call_param + ".id", "required");
    if (call.name.empty()) throw_field(call_param + ".function.name", "required");
    const OrderedJson arguments = OrderedJson::parse(call.arguments, nullptr, /*allow_exceptions=*/false);
    if (arguments.is_discarded()) throw_field(call_param + ".function.arguments", "not valid JSON");
    if (!arguments.is_object()) throw_field(call_param + ".function.arguments", "not a JSON object");
  }
}

// A tool message answers one call of the assistant message that the run of tool messages it belongs to follows.
void check_tool_result(const ChatMessage& message, const std::string& param, const ChatMessage* calling,
                       size_t calling_index) {
  if (message.tool_call_id.empty()) throw_field(param + ".tool_call_id", "required on a tool message");
  if (calling == nullptr) {
    throw_field(param + ".role", "a tool message must follow an assistant message with tool_calls, or another "
                                 "tool message");
  }
  for (const ToolCall& call : calling->tool_calls) {
    if (call.id == message.tool_call_id) return;
  }
  throw_field(param + ".tool_call_id", "\"" + message.tool_call_id + "\" is not the id of a call in " +
                                           message_param(calling_index) + ".tool_calls");
}

void check_messages(std::span<const ChatMessage> messages) {
  const ChatMessage* calling = nullptr;
  size_t calling_index = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    const std::string param = message_param(i);
    check_role(message, param);
    check_tool_calls(message, param);
    if (message.role == "tool") {
      check_tool_result(message, param, calling, calling_index);
      continue;
    }
    if (!message.tool_call_id.empty()) throw_field(param + ".tool_call_id", "only a tool message answers a call");
    calling = message.tool_calls.empty() ? nullptr : &message;
    calling_index = i;
  }
}

// ---- JSON as the templates write it ---------------------------------------------------------------------------

// JSON as Python's json.dumps writes it by default (", " and ": " between items), which is what the models' own
// templates (Jinja's tojson) and Mistral's tokenizer put in the prompts they were trained on.
std::string python_json(const OrderedJson& value) {
  const auto scalar = [](const OrderedJson& v) {
    return v.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
  };
  std::string out;
  if (value.is_object()) {
    for (auto it = value.begin(); it != value.end(); ++it) {
      out += (it == value.begin() ? "" : ", ") + scalar(OrderedJson(it.key())) + ": " + python_json(it.value());
    }
    return "{" + out + "}";
  }
  if (value.is_array()) {
    for (size_t i = 0; i < value.size(); ++i) out += (i == 0 ? "" : ", ") + python_json(value[i]);
    return "[" + out + "]";
  }
  return scalar(value);
}

// {"name": ..., <arguments_key>: {...}}: the object of one call in every template (checked by check_messages).
OrderedJson call_object(const ToolCall& call, const std::string& arguments_key) {
  return {{"name", call.name}, {arguments_key, OrderedJson::parse(call.arguments)}};
}

// ---- ChatML ---------------------------------------------------------------------------------------------------

// The literal default system prompt of a ChatML template, as SmolLM2's (and Qwen's) write it: one string
// literal '<|im_start|>system\n...<|im_end|>'. Empty when the system text is computed rather than literal.
std::string chatml_default_system_prompt(std::string_view jinja) {
  constexpr std::string_view kStart = "<|im_start|>system";
  const size_t start = jinja.find(kStart);
  if (start == std::string_view::npos) return {};
  std::string_view rest = jinja.substr(start + kStart.size());
  if (rest.starts_with("\n")) {
    rest.remove_prefix(1);
  } else if (rest.starts_with("\\n")) {  // the newline as an escape inside the Jinja string literal
    rest.remove_prefix(2);
  } else {
    return {};
  }
  const size_t end = rest.find("<|im_end|>");
  if (end == std::string_view::npos) return {};
  const std::string_view text = rest.substr(0, end);
  if (text.empty() || text.find_first_of("'\"{}+\\") != std::string_view::npos) return {};
  return std::string(text);
}

// SmolLM2's template defines no tools, so Strata follows the Hermes/Qwen convention that ChatML models trained for
// tools know: the system turn lists the functions inside <tools></tools>, one JSON object per line, and asks for
// each call as a JSON object inside <tool_call></tool_call>. The instruction's wording is Strata's own.
std::string chatml_tools_section(std::span<const ToolDefinition> tools) {
  std::string text =
      "# Tools\n\nYou may call one or more functions to help answer the user. The functions' signatures are "
      "listed inside <tools></tools>, one per line:\n<tools>";
  for (const ToolDefinition& tool : tools) text += "\n" + python_json(openai_tool_json(tool));
  return text +
         "\n</tools>\n\nTo call a function, answer with one JSON object per call, holding the function's name and "
         "its arguments, each inside <tool_call></tool_call> tags:\n<tool_call>\n{\"name\": <function-name>, "
         "\"arguments\": <arguments-as-a-JSON-object>}\n</tool_call>";
}

std::string chatml_tool_calls(const ChatMessage& message) {
  std::string text = "<|im_start|>assistant";
  if (!message.content.empty()) text += "\n" + message.content;
  for (const ToolCall& call : message.tool_calls) {
    text += "\n<tool_call>\n" + python_json(call_object(call, "arguments")) + "\n</tool_call>";
  }
  return text + "<|im_end|>\n";
}

// A run of tool messages makes one user turn holding one <tool_response> block per result.
std::string chatml_tool_response(std::span<const ChatMessage> messages, size_t index) {
  std::string text;
  if (index == 0 || messages[index - 1].role != "tool") text += "<|im_start|>user";
  text += "\n<tool_response>\n" + messages[index].content + "\n</tool_response>";
  if (index + 1 == messages.size() || messages[index + 1].role != "tool") text += "<|im_end|>\n";
  return text;
}

std::string render_chatml(std::span<const ChatMessage> messages, std::span<const ToolDefinition> tools,
                          bool add_generation_prompt, const std::string& default_system_prompt) {
  std::string out;
  size_t first = 0;
  if (!tools.empty()) {  // the tools join the system turn: the given one, or the default
    const bool given = !messages.empty() && messages[0].role == "system";
    const std::string& system = given ? messages[0].content : default_system_prompt;
    out += "<|im_start|>system\n" + (system.empty() ? "" : system + "\n\n") + chatml_tools_section(tools) +
           "<|im_end|>\n";
    first = given ? 1 : 0;
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    // As SmolLM2's template does: inside the loop, so an empty conversation gets no system prompt.
    if (i == 0 && tools.empty() && message.role != "system" && !default_system_prompt.empty()) {
      out += "<|im_start|>system\n" + default_system_prompt + "<|im_end|>\n";
    }
    if (message.role == "tool") {
      out += chatml_tool_response(messages, i);
    } else if (!message.tool_calls.empty()) {
      out += chatml_tool_calls(message);
    } else {
      out += "<|im_start|>" + message.role + "\n" + message.content + "<|im_end|>\n";
    }
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

// ---- Llama 3 --------------------------------------------------------------------------------------------------

std::string llama3_block(std::string_view role, std::string_view content) {
  return "<|start_header_id|>" + std::string(role) + "<|end_header_id|>\n\n" + std::string(content) + "<|eot_id|>";
}

// Llama 3.1's "JSON based tool calling" (Meta's llama3_1 prompt-format documentation, and the default of the
// model's Hugging Face template, tools_in_user_message): the function definitions, as indented JSON, open the
// first user message after this instruction, and the model answers a call with {"name": ..., "parameters": ...}.
constexpr std::string_view kLlama3ToolInstruction =
    "Given the following functions, please respond with a JSON for a function call with its proper arguments that "
    "best answers the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": dictionary "
    "of argument name and its value}. Do not use variables.\n\n";

std::string llama3_user_with_tools(std::string_view content, std::span<const ToolDefinition> tools) {
  std::string text(kLlama3ToolInstruction);
  for (const ToolDefinition& tool : tools) {
    text += openai_tool_json(tool).dump(4, ' ', false, OrderedJson::error_handler_t::replace) + "\n\n";
  }
  return text + std::string(trim(content));
}

// The index of the message that carries the tools: the first one after an optional system message, a user one.
size_t llama3_tools_message(std::span<const ChatMessage> messages) {
  const size_t first = !messages.empty() && messages[0].role == "system" ? 1 : 0;
  if (first == messages.size()) throw_field("messages", "the llama3 chat template puts the tools in the first user "
                                                        "message, and there is none");
  if (messages[first].role != "user") {
    throw_field(message_param(first) + ".role", "the llama3 chat template puts the tools in the first user "
                                                "message: the conversation must start with one (after an optional "
                                                "system message)");
  }
  return first;
}

std::string llama3_message(const ChatMessage& message, size_t index) {
  if (message.role == "tool") return llama3_block("ipython", message.content);  // results go untrimmed
  if (message.tool_calls.empty()) return llama3_block(message.role, trim(message.content));
  if (message.tool_calls.size() > 1) {
    throw_field(message_param(index) + ".tool_calls", "the llama3 chat template has one tool call per assistant "
                                                      "message, got " + std::to_string(message.tool_calls.size()));
  }
  // As the model's template does, an assistant message that calls a tool is only the call; its content is left out.
  return llama3_block("assistant", python_json(call_object(message.tool_calls[0], "parameters")));
}

std::string render_llama3(std::span<const ChatMessage> messages, std::span<const ToolDefinition> tools,
                          bool add_generation_prompt, const std::string& default_system_prompt) {
  std::string out = "<|begin_of_text|>";
  const bool given_system = !messages.empty() && messages[0].role == "system";
  size_t first = 0;
  size_t tools_message = messages.size();
  if (!tools.empty()) {
    // Llama 3.1's template opens the system turn with "Environment: ipython" whenever tools are given (the line
    // that enables the ipython role of tool results); the knowledge-date lines are left out, as without tools.
    tools_message = llama3_tools_message(messages);
    const std::string_view system = trim(given_system ? messages[0].content : default_system_prompt);
    out += llama3_block("system", "Environment: ipython" + (system.empty() ? "" : "\n\n" + std::string(system)));
    first = given_system ? 1 : 0;
  } else if (!default_system_prompt.empty() && !given_system) {
    out += llama3_block("system", trim(default_system_prompt));
  }
  for (size_t i = first; i < messages.size(); ++i) {
    out += i == tools_message ? llama3_block("user", llama3_user_with_tools(messages[i].content, tools))
                              : llama3_message(messages[i], i);
  }
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

// ---- Mistral --------------------------------------------------------------------------------------------------

// After an optional first system message: user, assistant, user, ...; an assistant message with tool calls is
// followed by the tool results, and those by an assistant message (as Mistral's tokenizer validates).
void check_mistral_order(std::span<const ChatMessage> messages, size_t first) {
  for (size_t i = first; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    const ChatMessage* previous = i > first ? &messages[i - 1] : nullptr;
    bool allowed = false;
    if (role == "user") {
      allowed = previous == nullptr || (previous->role == "assistant" && previous->tool_calls.empty());
    } else if (role == "assistant") {
      allowed = previous != nullptr && (previous->role == "user" || previous->role == "tool");
    } else if (role == "tool") {
      allowed = previous != nullptr && (previous->role == "tool" || !previous->tool_calls.empty());
    }
    if (!allowed) {
      throw_field(message_param(i) + ".role",
                  "mistral chat template: \"" + role + "\" cannot come " +
                      (previous ? "after \"" + previous->role + "\"" : std::string("first")) +
                      "; after an optional first system message the roles alternate user/assistant/user/..., and "
                      "an assistant's tool calls are followed by their tool messages, then by an assistant message");
    }
  }
}

// The v3 tokenizer's markers (Mistral-7B-Instruct-v0.3): [AVAILABLE_TOOLS] [<tools as OpenAI's objects>]
// [/AVAILABLE_TOOLS] before the last user turn; calls [TOOL_CALLS] [{"name", "arguments", "id"}, ...]</s>;
// each result [TOOL_RESULTS] {"content": ..., "call_id": ...}[/TOOL_RESULTS].
std::string mistral_available_tools(std::span<const ToolDefinition> tools) {
  OrderedJson list = OrderedJson::array();
  for (const ToolDefinition& tool : tools) list.push_back(openai_tool_json(tool));
  return "[AVAILABLE_TOOLS] " + python_json(list) + "[/AVAILABLE_TOOLS]";
}

std::string mistral_tool_calls(const ChatMessage& message) {
  OrderedJson list = OrderedJson::array();
  for (const ToolCall& call : message.tool_calls) {
    OrderedJson object = call_object(call, "arguments");
    object["id"] = call.id;
    list.push_back(std::move(object));
  }
  return "[TOOL_CALLS] " + python_json(list) + "</s>";
}

// The content goes in as JSON when it is JSON, and as a JSON string otherwise, as Mistral's tokenizer does.
std::string mistral_tool_result(const ChatMessage& message) {
  OrderedJson content = OrderedJson::parse(message.content, nullptr, /*allow_exceptions=*/false);
  if (content.is_discarded()) content = message.content;
  const OrderedJson result = {{"content", std::move(content)}, {"call_id", message.tool_call_id}};
  return "[TOOL_RESULTS] " + python_json(result) + "[/TOOL_RESULTS]";
}

size_t mistral_last_user(std::span<const ChatMessage> messages) {
  for (size_t i = messages.size(); i-- > 0;) {
    if (messages[i].role == "user") return i;
  }
  throw_field("messages", "the mistral chat template puts the tools before the last user message, and there is none");
}

// [INST] user [/INST]answer</s>[INST] ... : the system prompt has no block of its own, so it is prepended to the
// first user message. The prompt always ends ready for the assistant, so add_generation_prompt adds nothing.
std::string render_mistral(std::span<const ChatMessage> messages, std::span<const ToolDefinition> tools,
                           const std::string& default_system_prompt) {
  std::string system = default_system_prompt;
  size_t first = 0;
  if (!messages.empty() && messages[0].role == "system") {
    system = messages[0].content;
    first = 1;
  }
  check_mistral_order(messages, first);
  const size_t tools_before = tools.empty() ? messages.size() : mistral_last_user(messages);
  std::string out = "<s>";
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    if (i == tools_before) out += mistral_available_tools(tools);
    if (message.role == "user") {
      const bool with_system = i == first && !system.empty();
      out += "[INST] " + (with_system ? system + "\n\n" + message.content : message.content) + " [/INST]";
    } else if (message.role == "tool") {
      out += mistral_tool_result(message);
    } else if (!message.tool_calls.empty()) {
      out += mistral_tool_calls(message);
    } else {
      out += message.content + "</s>";
    }
  }
  return out;
}

// ---- Reading calls back ---------------------------------------------------------------------------------------

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

void skip_space(std::string_view text, size_t& pos) {
  while (pos < text.size() && is_space(text[pos])) ++pos;
}

// Matches `literal` at pos after any whitespace; whitespace inside the literal matches any run of it, or none.
// Advances pos only on a match.
bool consume(std::string_view text, size_t& pos, std::string_view literal) {
  size_t at = pos;
  skip_space(text, at);
  for (char c : literal) {
    if (is_space(c)) {
      skip_space(text, at);
    } else if (at < text.size() && text[at] == c) {
      ++at;
    } else {
      return false;
    }
  }
  pos = at;
  return true;
}

// The end of the JSON object starting at `start` (its brackets balanced, strings skipped), or npos. Whether it is
// valid JSON is left to the parser.
size_t json_object_end(std::string_view text, size_t start) {
  if (start >= text.size() || text[start] != '{') return std::string_view::npos;
  int depth = 0;
  bool in_string = false;
  for (size_t at = start; at < text.size(); ++at) {
    const char c = text[at];
    if (in_string) {
      if (c == '\\') {
        ++at;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if ((c == '}' || c == ']') && --depth == 0) {
      return at + 1;
    }
  }
  return std::string_view::npos;
}

// One call object at pos: exactly "name" (a non-empty string) and the arguments object, plus "id" where allowed.
std::optional<ParsedToolCall> read_call(std::string_view text, size_t& pos, const std::string& arguments_key,
                                        bool id_allowed) {
  skip_space(text, pos);
  const size_t end = json_object_end(text, pos);
  if (end == std::string_view::npos) return std::nullopt;
  const OrderedJson object = OrderedJson::parse(text.substr(pos, end - pos), nullptr, /*allow_exceptions=*/false);
  if (object.is_discarded()) return std::nullopt;
  const auto name = object.find("name");
  const auto arguments = object.find(arguments_key);
  if (name == object.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) return std::nullopt;
  if (arguments == object.end() || !arguments->is_object()) return std::nullopt;
  const auto id = object.find("id");
  const bool has_id = id_allowed && id != object.end() && id->is_string();
  if (object.size() != (has_id ? 3u : 2u)) return std::nullopt;
  pos = end;
  return ParsedToolCall{name->get<std::string>(),
                        arguments->dump(-1, ' ', false, OrderedJson::error_handler_t::replace)};
}

}  // namespace

// -----------------------------------------------------------------------------------------------------------------

OrderedJson ToolCallSyntax::call_schema(std::span<const ToolDefinition> tools) const {
  if (tools.empty()) throw_field("tools", "a tool call's schema needs at least one tool");
  OrderedJson branches = OrderedJson::array();
  for (const ToolDefinition& tool : tools) {
    branches.push_back({{"type", "object"},
                        {"properties", {{"name", {{"const", tool.name}}}, {arguments_key, arguments_schema(tool)}}},
                        {"required", OrderedJson::array({"name", arguments_key})},
                        {"additionalProperties", false}});
  }
  if (branches.size() == 1) return branches[0];
  return {{"anyOf", std::move(branches)}};
}

ChatTemplate::ChatTemplate(ChatTemplateKind kind, std::string default_system_prompt)
    : kind_(kind), default_system_prompt_(std::move(default_system_prompt)) {}

ChatTemplate ChatTemplate::from_name(std::string_view name, std::string default_system_prompt) {
  if (name == "chatml") return ChatTemplate(ChatTemplateKind::chatml, std::move(default_system_prompt));
  if (name == "llama3") return ChatTemplate(ChatTemplateKind::llama3, std::move(default_system_prompt));
  if (name == "mistral") return ChatTemplate(ChatTemplateKind::mistral, std::move(default_system_prompt));
  throw std::invalid_argument("unknown chat template \"" + std::string(name) +
                              "\" (expected chatml, llama3 or mistral)");
}

ChatTemplate ChatTemplate::detect(std::string_view jinja_template) {
  const auto has = [&](std::string_view marker) { return jinja_template.find(marker) != std::string_view::npos; };
  if (!has("<|im_start|>") && has("<|start_header_id|>")) return ChatTemplate(ChatTemplateKind::llama3);
  if (!has("<|im_start|>") && has("[INST]")) return ChatTemplate(ChatTemplateKind::mistral);
  // ChatML, also the default. The template's own literal system prompt (SmolLM2's) becomes the default one.
  return ChatTemplate(ChatTemplateKind::chatml, chatml_default_system_prompt(jinja_template));
}

std::string ChatTemplate::render(std::span<const ChatMessage> messages, std::span<const ToolDefinition> tools,
                                 bool add_generation_prompt) const {
  check_messages(messages);
  check_tool_definitions(tools);
  switch (kind_) {
    case ChatTemplateKind::chatml:
      return render_chatml(messages, tools, add_generation_prompt, default_system_prompt_);
    case ChatTemplateKind::llama3:
      return render_llama3(messages, tools, add_generation_prompt, default_system_prompt_);
    case ChatTemplateKind::mistral:
      return render_mistral(messages, tools, default_system_prompt_);
  }
  throw std::logic_error("unhandled chat template kind");
}

ToolCallSyntax ChatTemplate::tool_call_syntax() const {
  switch (kind_) {
    case ChatTemplateKind::chatml:
      return {"<tool_call>\n", "\n</tool_call>", "arguments", ToolCallRepetition::blocks, "\n"};
    case ChatTemplateKind::llama3:
      return {"", "", "parameters", ToolCallRepetition::single, ""};
    case ChatTemplateKind::mistral:
      return {"[TOOL_CALLS] [", "]", "arguments", ToolCallRepetition::list_items, ", "};
  }
  throw std::logic_error("unhandled chat template kind");
}

std::optional<std::vector<ParsedToolCall>> ChatTemplate::parse_tool_calls(std::string_view text) const {
  const ToolCallSyntax syntax = tool_call_syntax();
  std::vector<ParsedToolCall> calls;
  size_t pos = 0;
  if (!consume(text, pos, syntax.prefix)) return std::nullopt;
  while (true) {
    std::optional<ParsedToolCall> call =
        read_call(text, pos, syntax.arguments_key, /*id_allowed=*/kind_ == ChatTemplateKind::mistral);
    if (!call) return std::nullopt;
    calls.push_back(std::move(*call));
    if (syntax.repetition == ToolCallRepetition::list_items && consume(text, pos, syntax.separator)) continue;
    if (!consume(text, pos, syntax.suffix)) return std::nullopt;
    skip_space(text, pos);
    if (pos == text.size()) return calls;
    const bool next_block = syntax.repetition == ToolCallRepetition::blocks && consume(text, pos, syntax.separator) &&
                            consume(text, pos, syntax.prefix);
    if (!next_block) return std::nullopt;
  }
}

}  // namespace strata
