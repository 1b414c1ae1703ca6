#pragma once
// Chat templates rendered in C++ (no Jinja): ChatML (SmolLM2, with its default system prompt), Llama 3, Mistral.
#include <span>
#include <string>
#include <string_view>

namespace strata {

struct ChatMessage {
  std::string role;     // "system", "user", "assistant"
  std::string content;
};

enum class ChatTemplateKind { chatml, llama3, mistral };

class ChatTemplate {
 public:
  ChatTemplate(ChatTemplateKind kind, std::string default_system_prompt = "");
  // "chatml" | "llama3" | "mistral"; throws std::invalid_argument naming the value otherwise.
  static ChatTemplate from_name(std::string_view name, std::string default_system_prompt = "");
  // Picks the template by looking at a model's Jinja template text (GGUF tokenizer.chat_template).
  static ChatTemplate detect(std::string_view jinja_template);

  // The prompt text; it contains special-token strings and is meant to be encoded with parse_special = true.
  // Throws std::invalid_argument for an unknown role or an order the template cannot express.
  std::string render(std::span<const ChatMessage> messages, bool add_generation_prompt) const;
  ChatTemplateKind kind() const { return kind_; }

 private:
  ChatTemplateKind kind_;
  std::string default_system_prompt_;
};

// SmolLM2's default system prompt (no final period, as the model's template has it).
inline constexpr std::string_view kSmolLm2SystemPrompt =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

}  // namespace strata
