// libFuzzer harness: chat templates (model/chat_template.h) rendering arbitrary conversations, and the template
// detection on arbitrary Jinja text. The input is "role\x1fcontent" records separated by \x1e; its first byte picks
// the template and add_generation_prompt.
// Expected: std::invalid_argument for an unknown role or an order the template cannot express. Bugs: a crash, a
// sanitizer report, a user or assistant message whose text (trimmed, as Llama 3 does) is not in the prompt.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "model/chat_template.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

using strata::ChatMessage;

std::vector<ChatMessage> split_messages(std::string_view text) {
  std::vector<ChatMessage> messages;
  while (!text.empty()) {
    const size_t end = std::min(text.find('\x1e'), text.size());
    const std::string_view record = text.substr(0, end);
    const size_t separator = std::min(record.find('\x1f'), record.size());
    messages.push_back({std::string(record.substr(0, separator)),
                        std::string(record.substr(std::min(separator + 1, record.size())))});
    text.remove_prefix(std::min(end + 1, text.size()));
  }
  return messages;
}

std::string_view trim(std::string_view text) {
  const size_t first = text.find_first_not_of(" \t\n\r\f\v");
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(" \t\n\r\f\v") - first + 1);
}

void render_and_check(const strata::ChatTemplate& chat_template, const std::vector<ChatMessage>& messages,
                      bool add_generation_prompt) {
  std::string prompt;
  try {
    prompt = chat_template.render(messages, add_generation_prompt);
  } catch (const std::invalid_argument&) {
    return;
  }
  for (const ChatMessage& message : messages) {
    if (message.role != "system" && prompt.find(trim(message.content)) == std::string::npos) {
      strata::fuzz::fail("a " + message.role + " message is missing from the rendered prompt");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const auto kinds = {strata::ChatTemplateKind::chatml, strata::ChatTemplateKind::llama3,
                      strata::ChatTemplateKind::mistral};
  const strata::ChatTemplateKind kind = kinds.begin()[data[0] % 3];
  const bool add_generation_prompt = (data[0] & 4) != 0;
  const std::string system_prompt = (data[0] & 8) != 0 ? std::string(strata::kSmolLm2SystemPrompt) : "";

  const std::vector<ChatMessage> messages = split_messages(text);
  render_and_check(strata::ChatTemplate(kind, system_prompt), messages, add_generation_prompt);
  render_and_check(strata::ChatTemplate::detect(text), messages, add_generation_prompt);
  return 0;
}
