// Chat templates: the rendered text must equal what each model's own Jinja template produces.
#include "model/chat_template.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "model/gguf_file.h"
#include "model/tokenizer.h"
#include "tests/test_paths.h"

namespace strata {
namespace {

using Messages = std::vector<ChatMessage>;

TEST(ChatTemplate, ChatMlInsertsTheDefaultSystemPrompt) {
  const ChatTemplate chatml(ChatTemplateKind::chatml, std::string(kSmolLm2SystemPrompt));
  const Messages messages = {{"user", "Hi"}, {"assistant", "Hello!"}, {"user", "What is 2+2?"}};
  EXPECT_EQ(chatml.render(messages, true),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n"
            "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(chatml.render(Messages{{"user", "Hi"}}, false),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplate, ChatMlKeepsAGivenSystemMessage) {
  const ChatTemplate chatml(ChatTemplateKind::chatml, std::string(kSmolLm2SystemPrompt));
  EXPECT_EQ(chatml.render(Messages{{"system", "Be brief."}, {"user", "Hi"}}, true),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  // As in the Jinja template, the default is inserted inside the message loop: none for no messages.
  EXPECT_EQ(chatml.render(Messages{}, true), "<|im_start|>assistant\n");
  const ChatTemplate bare(ChatTemplateKind::chatml);
  EXPECT_EQ(bare.render(Messages{{"user", "Hi"}}, true), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, Llama3) {
  const ChatTemplate llama3 = ChatTemplate::from_name("llama3");
  EXPECT_EQ(llama3.render(Messages{{"system", "Be brief."}, {"user", "  Hi\n"}, {"assistant", "Hello"}}, true),
            "<|begin_of_text|>"
            "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"  // content is trimmed, as the template does
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  const ChatTemplate with_default = ChatTemplate::from_name("llama3", "Default.");
  EXPECT_EQ(with_default.render(Messages{{"user", "Hi"}}, false),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nDefault.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
}

TEST(ChatTemplate, Mistral) {
  const ChatTemplate mistral = ChatTemplate::from_name("mistral");
  EXPECT_EQ(mistral.render(Messages{{"user", "Hi"}, {"assistant", "Hello"}, {"user", "Bye"}}, true),
            "<s>[INST] Hi [/INST]Hello</s>[INST] Bye [/INST]");
  EXPECT_EQ(mistral.render(Messages{{"system", "Be brief."}, {"user", "Hi"}}, true),
            "<s>[INST] Be brief.\n\nHi [/INST]");
  const ChatTemplate with_default = ChatTemplate::from_name("mistral", "Default.");
  EXPECT_EQ(with_default.render(Messages{{"user", "Hi"}, {"assistant", "Yo"}, {"user", "Q"}}, true),
            "<s>[INST] Default.\n\nHi [/INST]Yo</s>[INST] Q [/INST]");
}

TEST(ChatTemplate, MistralRequiresAlternatingRoles) {
  const ChatTemplate mistral = ChatTemplate::from_name("mistral");
  EXPECT_THROW(mistral.render(Messages{{"user", "a"}, {"user", "b"}}, true), std::invalid_argument);
  EXPECT_THROW(mistral.render(Messages{{"assistant", "a"}}, true), std::invalid_argument);
  EXPECT_THROW(mistral.render(Messages{{"user", "a"}, {"system", "b"}}, true), std::invalid_argument);
  EXPECT_THROW(mistral.render(Messages{{"system", "a"}, {"system", "b"}}, true), std::invalid_argument);
}

TEST(ChatTemplate, RejectsUnknownRolesAndNames) {
  for (const char* name : {"chatml", "llama3", "mistral"}) {
    EXPECT_THROW(ChatTemplate::from_name(name).render(Messages{{"user", "a"}, {"wizard", "b"}}, true),
                 std::invalid_argument)
        << name;
  }
  EXPECT_THROW(ChatTemplate::from_name("jinja"), std::invalid_argument);
  try {
    ChatTemplate::from_name("zephyr");
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("zephyr"), std::string::npos);
  }
}

TEST(ChatTemplate, DetectsByMarkers) {
  EXPECT_EQ(ChatTemplate::detect("{{ '<|im_start|>' + message['role'] }}").kind(), ChatTemplateKind::chatml);
  EXPECT_EQ(ChatTemplate::detect("{{ '<|start_header_id|>' + message['role'] }}").kind(), ChatTemplateKind::llama3);
  EXPECT_EQ(ChatTemplate::detect("{{ '[INST] ' + message['content'] + ' [/INST]' }}").kind(),
            ChatTemplateKind::mistral);
  EXPECT_EQ(ChatTemplate::detect("").kind(), ChatTemplateKind::chatml);
  // A literal system prompt in an escaped ChatML template becomes the default.
  const ChatTemplate qwen_like =
      ChatTemplate::detect("{{ '<|im_start|>system\\nYou are helpful.<|im_end|>\\n' }}{{ '<|im_start|>' }}");
  EXPECT_EQ(qwen_like.render(Messages{{"user", "Hi"}}, false),
            "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplate, SmolLm2FileTemplateRendersAndTokenizes) {
  const auto gguf = GgufFile::open(test::smollm2_gguf_path());
  const ChatTemplate chatml = ChatTemplate::detect(gguf->get_string("tokenizer.chat_template").value_or(""));
  ASSERT_EQ(chatml.kind(), ChatTemplateKind::chatml);
  const std::string prompt = chatml.render(Messages{{"user", "Hi"}}, true);
  EXPECT_EQ(prompt,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  // Ids from tools/reference_tokenizer.py, encoding with special tokens parsed.
  const Tokenizer tok = Tokenizer::from_gguf(*gguf);
  EXPECT_EQ(tok.encode(prompt, true),
            (std::vector<int32_t>{1,    9690, 198,   2683, 359,  253,  5356, 5646, 11173, 3365, 3511, 308,  34519,
                                  28,   7018, 411,   407,  19712, 8182, 2,   198,  1,    4093, 198,   26843, 2,
                                  198,  1,    520,   9531, 198}));
}

}  // namespace
}  // namespace strata
