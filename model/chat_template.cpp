#include "model/chat_template.h"

#include <stdexcept>

namespace strata {

namespace {

void check_role(const ChatMessage& message) {
  if (message.role != "system" && message.role != "user" && message.role != "assistant") {
    throw std::invalid_argument("unknown chat role \"" + message.role + "\" (expected system, user or assistant)");
  }
}

// Jinja's trim, which the Llama 3 template applies to every message.
std::string_view trim(std::string_view text) {
  constexpr std::string_view kSpace = " \t\n\r\f\v";
  const size_t first = text.find_first_not_of(kSpace);
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(kSpace) - first + 1);
}

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

std::string render_chatml(std::span<const ChatMessage> messages, bool add_generation_prompt,
                          const std::string& default_system_prompt) {
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    check_role(messages[i]);
    // As SmolLM2's template does: inside the loop, so an empty conversation gets no system prompt.
    if (i == 0 && messages[0].role != "system" && !default_system_prompt.empty()) {
      out += "<|im_start|>system\n" + default_system_prompt + "<|im_end|>\n";
    }
    out += "<|im_start|>" + messages[i].role + "\n" + messages[i].content + "<|im_end|>\n";
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

std::string render_llama3(std::span<const ChatMessage> messages, bool add_generation_prompt,
                          const std::string& default_system_prompt) {
  const auto block = [](std::string_view role, std::string_view content) {
    return "<|start_header_id|>" + std::string(role) + "<|end_header_id|>\n\n" + std::string(trim(content)) +
           "<|eot_id|>";
  };
  std::string out = "<|begin_of_text|>";
  if (!default_system_prompt.empty() && (messages.empty() || messages[0].role != "system")) {
    out += block("system", default_system_prompt);
  }
  for (const ChatMessage& message : messages) {
    check_role(message);
    out += block(message.role, message.content);
  }
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

// [INST] user [/INST]answer</s>[INST] ... : the system prompt has no block of its own, so it is prepended to the
// first user message; after it the roles must alternate user, assistant, user, ...  The prompt always ends ready
// for the assistant, so add_generation_prompt adds nothing.
std::string render_mistral(std::span<const ChatMessage> messages, const std::string& default_system_prompt) {
  std::string system = default_system_prompt;
  size_t first = 0;
  if (!messages.empty() && messages[0].role == "system") {
    system = messages[0].content;
    first = 1;
  }
  std::string out = "<s>";
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    check_role(message);
    const char* expected = (i - first) % 2 == 0 ? "user" : "assistant";
    if (message.role != expected) {
      throw std::invalid_argument("mistral chat template: message " + std::to_string(i) + " has role \"" +
                                  message.role + "\"; after an optional first system message the roles must "
                                  "alternate user/assistant/user/...");
    }
    if (message.role == "user") {
      const bool with_system = i == first && !system.empty();
      out += "[INST] " + (with_system ? system + "\n\n" + message.content : message.content) + " [/INST]";
    } else {
      out += message.content + "</s>";
    }
  }
  return out;
}

}  // namespace

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

std::string ChatTemplate::render(std::span<const ChatMessage> messages, bool add_generation_prompt) const {
  switch (kind_) {
    case ChatTemplateKind::chatml:
      return render_chatml(messages, add_generation_prompt, default_system_prompt_);
    case ChatTemplateKind::llama3:
      return render_llama3(messages, add_generation_prompt, default_system_prompt_);
    case ChatTemplateKind::mistral:
      return render_mistral(messages, default_system_prompt_);
  }
  throw std::logic_error("unhandled chat template kind");
}

}  // namespace strata
