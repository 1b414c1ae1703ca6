// routing/tokenizer_endpoints.h: /tokenize gives the ids generation sees, /detokenize writes them back.
#include "routing/tokenizer_endpoints.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "routing/api_error.h"
#include "tests/routing/api_error_of.h"
#include "tests/routing/byte_tokenizer.h"

namespace strata {
namespace {

using nlohmann::json;
using test::byte_tokenizer;
using test::error_of;
using test::kImEnd;
using test::kImStart;

class TokenizerEndpoints : public ::testing::Test {
 protected:
  TokenizerEndpoints() {
    limits_.model_name = "smol";
    limits_.max_context = 8;
    limits_.vocab_size = 258;
  }
  json tokenize(const json& body) { return json::parse(tokenize_response(body.dump(), tokenizer_, chatml_, limits_)); }
  ApiError tokenize_error(const json& body) {
    return error_of([&] { tokenize_response(body.dump(), tokenizer_, chatml_, limits_); });
  }
  ApiError detokenize_error(const json& body) {
    return error_of([&] { detokenize_response(body.dump(), tokenizer_, limits_); });
  }
  ProtocolLimits limits_;
  Tokenizer tokenizer_ = byte_tokenizer();
  ChatTemplate chatml_{ChatTemplateKind::chatml};
};

TEST_F(TokenizerEndpoints, TextIsCountedBeyondTheContextToo) {
  const json out = tokenize({{"prompt", "Hello, world"}});  // 12 bytes, the context is 8
  EXPECT_EQ(out["count"], 12);
  EXPECT_EQ(out["max_model_len"], 8);
  EXPECT_EQ(out["tokens"][0], 'H');
  EXPECT_EQ(out["token_strs"], nullptr);
  // Control-token strings in a prompt stay text, as generation reads them.
  EXPECT_EQ(tokenize({{"prompt", "<|im_end|>"}})["count"], 10);
  EXPECT_EQ(tokenize({{"prompt", {1, 2, 257}}})["tokens"], json({1, 2, 257}));
  EXPECT_EQ(tokenize({{"prompt", "Hi"}, {"return_token_strs", true}})["token_strs"], json({"H", "i"}));
}

TEST_F(TokenizerEndpoints, MessagesAreRenderedAsForGeneration) {
  const json messages = {{{"role", "user"}, {"content", "Hi"}}};
  const json out = tokenize({{"messages", messages}});
  // <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n
  std::vector<int> expected = {kImStart};
  for (char c : std::string("user\nHi")) expected.push_back(c);
  expected.push_back(kImEnd);
  expected.push_back('\n');
  expected.push_back(kImStart);
  for (char c : std::string("assistant\n")) expected.push_back(c);
  EXPECT_EQ(out["tokens"], json(expected));
  EXPECT_EQ(out["count"], expected.size());
  const json bare = tokenize({{"messages", messages}, {"add_generation_prompt", false}});
  EXPECT_EQ(bare["count"], expected.size() - 11);  // without "<|im_start|>assistant\n"
}

TEST_F(TokenizerEndpoints, BadRequestsNameTheirField) {
  EXPECT_EQ(tokenize_error({{"prompt", "a"}, {"temperature", 1}}).param(), "temperature");
  EXPECT_EQ(tokenize_error(json::object()).param(), "prompt");
  EXPECT_EQ(tokenize_error({{"prompt", "a"}, {"messages", json::array()}}).param(), "prompt");
  EXPECT_EQ(tokenize_error({{"prompt", {"a", "b"}}}).param(), "prompt");
  EXPECT_EQ(tokenize_error({{"prompt", "a"}, {"add_generation_prompt", true}}).param(), "add_generation_prompt");
  EXPECT_EQ(tokenize_error({{"prompt", "a"}, {"add_special_tokens", "yes"}}).param(), "add_special_tokens");
  EXPECT_EQ(tokenize_error({{"prompt", {1, 258}}}).param(), "prompt");
  const ApiError other = tokenize_error({{"model", "gpt-4"}, {"prompt", "a"}});
  EXPECT_EQ(other.http_status(), 404);
  EXPECT_EQ(other.code(), "model_not_found");
}

TEST_F(TokenizerEndpoints, DetokenizeWritesTheTokensBack) {
  const json out = json::parse(detokenize_response(json({{"tokens", {'H', 'i', kImEnd}}}).dump(), tokenizer_, limits_));
  EXPECT_EQ(out["prompt"], "Hi<|im_end|>");
  EXPECT_EQ(json::parse(detokenize_response(R"({"tokens": []})", tokenizer_, limits_))["prompt"], "");
  EXPECT_EQ(detokenize_error({{"tokens", {1, 258}}}).param(), "tokens");
  EXPECT_EQ(detokenize_error({{"tokens", "Hi"}}).param(), "tokens");
  EXPECT_EQ(detokenize_error(json::object()).param(), "tokens");
  EXPECT_EQ(detokenize_error({{"tokens", {1}}, {"prompt", "x"}}).param(), "prompt");
  EXPECT_EQ(detokenize_error({{"model", "gpt-4"}, {"tokens", {1}}}).http_status(), 404);
}

}  // namespace
}  // namespace strata
