#include "model/reconstruction_prompt.h"

#include <stdexcept>
#include <string>
#include <vector>

namespace strata {

ReconstructionPrompt reconstruction_prompt(const Tokenizer& tokenizer, const ChatTemplate& chat_template) {
  // A user message whose content cannot occur in the template's own text marks where the content ends.
  const std::string marker = "@@kvzip-context@@";
  const std::vector<ChatMessage> messages = {{"user", marker}};
  const std::string rendered = chat_template.render(messages, /*add_generation_prompt=*/true);
  const size_t at = rendered.rfind(marker);
  if (at == std::string::npos) throw std::logic_error("chat template: the user's content is not in its rendering");
  ReconstructionPrompt prompt;
  prompt.instruction =
      tokenizer.encode("\n\nRepeat the part of the previous context exactly, starting with", /*parse_special=*/false);
  prompt.answer_start = tokenizer.encode(rendered.substr(at + marker.size()), /*parse_special=*/true);
  return prompt;
}

}  // namespace strata
