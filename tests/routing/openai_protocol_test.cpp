// The OpenAI request parser and response builders, without sockets.
#include "routing/openai_protocol.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/byte_level.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "routing/api_error.h"
#include "tests/routing/api_error_of.h"
#include "tests/routing/byte_tokenizer.h"

namespace strata {
namespace {

using nlohmann::json;

using test::kImEnd;
using test::kImStart;
using test::byte_tokenizer;
using test::error_of;

ProtocolLimits test_limits() {
  ProtocolLimits limits;
  limits.model_name = "smol";
  limits.max_context = 64;
  limits.vocab_size = 258;
  return limits;
}

std::vector<ParsedCompletion> parse_batch(const json& body, ApiDialect dialect = ApiDialect::completions) {
  return parse_completion_request(body.dump(), dialect, test_limits());
}

// A request of one prompt.
ParsedCompletion parse(const json& body, ApiDialect dialect = ApiDialect::completions) {
  std::vector<ParsedCompletion> batch = parse_batch(body, dialect);
  EXPECT_EQ(batch.size(), 1u) << body.dump();
  return batch.at(0);
}

ParsedCompletion parse_chat(const json& body) { return parse(body, ApiDialect::chat); }

json with(json body, const json& extra) {
  body.update(extra);
  return body;
}

const json kCompletion = {{"model", "smol"}, {"prompt", "Hi"}};
const json kChat = {{"model", "smol"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}};

void expect_bad(const json& body, const std::string& param, ApiDialect dialect = ApiDialect::completions) {
  ApiError e = error_of([&] { parse(body, dialect); });
  EXPECT_EQ(e.http_status(), 400) << body.dump();
  EXPECT_EQ(e.type(), "invalid_request_error") << body.dump();
  EXPECT_EQ(e.param(), param) << body.dump() << " -> " << e.what();
}

void expect_bad_chat(const json& body, const std::string& param) { expect_bad(body, param, ApiDialect::chat); }

// ---------------------------------------------------------------------------------------------------------------
// Parsing

TEST(OpenAiProtocol, MalformedJsonIs400WithoutParam) {
  ApiError e = error_of([] { parse_completion_request("{\"prompt\": ", ApiDialect::completions, test_limits()); });
  EXPECT_EQ(e.http_status(), 400);
  EXPECT_EQ(e.type(), "invalid_request_error");
  EXPECT_EQ(e.param(), "");
  EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("line 1"), std::string::npos) << e.what();

  e = error_of([] { parse_completion_request("[1, 2]", ApiDialect::completions, test_limits()); });
  EXPECT_EQ(e.http_status(), 400);
  EXPECT_NE(std::string(e.what()).find("JSON object"), std::string::npos);
}

// Found by tests/fuzz/openai_request_fuzz.cpp: the JSON library's out_of_range for a number no double holds
// escaped as a 500 server_error.
TEST(OpenAiProtocol, NumberBeyondADoubleIs400) {
  ApiError e = error_of(
      [] { parse_completion_request("{\"prompt\": \"a\", \"max_tokens\": 2e2220000000}", ApiDialect::completions,
                                    test_limits()); });
  EXPECT_EQ(e.http_status(), 400);
  EXPECT_EQ(e.param(), "");
  EXPECT_NE(std::string(e.what()).find("not valid JSON: number overflow"), std::string::npos) << e.what();
}

TEST(OpenAiProtocol, ParsesACompletionWithDefaults) {
  ParsedCompletion p = parse(kCompletion);
  EXPECT_EQ(p.dialect, ApiDialect::completions);
  EXPECT_EQ(p.model, "smol");
  EXPECT_EQ(std::get<std::string>(p.prompt), "Hi");
  EXPECT_FALSE(p.stream);
  EXPECT_FALSE(p.logprobs);
  EXPECT_FALSE(p.max_tokens_given);
  EXPECT_EQ(p.request.n, 1);
  EXPECT_EQ(p.request.sampling.n_logprobs, -1);
  EXPECT_FLOAT_EQ(p.request.sampling.temperature, 1.0f);
  EXPECT_FALSE(p.request.kv_policy.has_value());
}

TEST(OpenAiProtocol, ParsesEverySamplingField) {
  ParsedCompletion p = parse(with(kCompletion, {{"max_tokens", 7},
                                                {"temperature", 0},
                                                {"top_p", 0.5},
                                                {"top_k", 40},
                                                {"min_p", 0.1},
                                                {"presence_penalty", -2},
                                                {"frequency_penalty", 1.5},
                                                {"seed", 1234},
                                                {"stop", {"\n", "END"}},
                                                {"n", 3},
                                                {"ignore_eos", true},
                                                {"logprobs", 5}}));
  const SamplingParams& s = p.request.sampling;
  EXPECT_EQ(s.max_tokens, 7);
  EXPECT_TRUE(p.max_tokens_given);
  EXPECT_EQ(s.temperature, 0.0f);
  EXPECT_FLOAT_EQ(s.top_p, 0.5f);
  EXPECT_EQ(s.top_k, 40);
  EXPECT_FLOAT_EQ(s.min_p, 0.1f);
  EXPECT_FLOAT_EQ(s.presence_penalty, -2.0f);
  EXPECT_FLOAT_EQ(s.frequency_penalty, 1.5f);
  EXPECT_EQ(s.seed, 1234u);
  EXPECT_EQ(s.stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_TRUE(s.ignore_eos);
  EXPECT_EQ(s.n_logprobs, 5);
  EXPECT_TRUE(p.logprobs);
  EXPECT_EQ(p.request.n, 3);
}

TEST(OpenAiProtocol, NullsAreIgnored) {
  ParsedCompletion p = parse(with(kCompletion, {{"user", "me"},
                                                {"suffix", nullptr},
                                                {"temperature", nullptr},
                                                {"stop", nullptr},
                                                {"max_tokens", nullptr}}));
  EXPECT_FLOAT_EQ(p.request.sampling.temperature, 1.0f);
  EXPECT_TRUE(p.request.sampling.stop.empty());
  EXPECT_FALSE(p.max_tokens_given);
}

TEST(OpenAiProtocol, UnknownFieldsAreRefusedUnlessTheOperatorIgnoresThem) {
  const json body = with(kCompletion, {{"something_new", {{"nested", true}}}});
  expect_bad(body, "something_new");
  expect_bad_chat(with(kChat, {{"prompt", "Hi"}}), "prompt");       // a completions field in a chat request
  expect_bad(with(kCompletion, {{"messages", json::array()}}), "messages");
  ProtocolLimits lenient = test_limits();
  lenient.ignore_unknown_fields = true;
  EXPECT_NO_THROW(parse_completion_request(body.dump(), ApiDialect::completions, lenient));
  // Fields the OpenAI API has and Strata does not implement are refused even then.
  const json functions = with(kChat, {{"functions", {{{"name", "f"}}}}});
  EXPECT_EQ(error_of([&] { parse_completion_request(functions.dump(), ApiDialect::chat, lenient); }).param(),
            "functions");
}

TEST(OpenAiProtocol, UnimplementedFieldsAreRefusedUnlessTheyAskForNothing) {
  expect_bad_chat(with(kChat, {{"function_call", "auto"}}), "function_call");
  expect_bad_chat(with(kChat, {{"tool_choice", "auto"}}), "tool_choice");  // implemented, but no tools are offered
  expect_bad_chat(with(kChat, {{"store", true}}), "store");
  expect_bad_chat(with(kChat, {{"modalities", {"text", "audio"}}}), "modalities");
  expect_bad(with(kCompletion, {{"best_of", 3}}), "best_of");
  expect_bad(with(kCompletion, {{"suffix", "end"}}), "suffix");
  EXPECT_NO_THROW(parse_chat(with(kChat, {{"response_format", {{"type", "text"}}},
                                          {"tools", json::array()},
                                          {"tool_choice", "none"},
                                          {"store", false},
                                          {"modalities", {"text"}},
                                          {"service_tier", "auto"}})));
  EXPECT_NO_THROW(parse(with(kCompletion, {{"best_of", 1}, {"suffix", ""}})));
  const ApiError e = error_of([&] { parse_chat(with(kChat, {{"functions", {{{"name", "f"}}}}})); });
  EXPECT_NE(std::string(e.what()).find("not supported"), std::string::npos) << e.what();
}

TEST(OpenAiProtocol, LogitBias) {
  for (ApiDialect dialect : {ApiDialect::completions, ApiDialect::chat}) {
    const json& base = dialect == ApiDialect::chat ? kChat : kCompletion;
    ParsedCompletion p = parse(with(base, {{"logit_bias", {{"200", 5}, {"7", -100}, {"65", 0.5}}}}), dialect);
    const std::vector<TokenPenalty>& bias = p.request.sampling.logit_bias;
    ASSERT_EQ(bias.size(), 3u);
    EXPECT_EQ(bias[0].id, 7);
    EXPECT_EQ(bias[0].amount, 100.0f);  // a penalty: the bias negated
    EXPECT_EQ(bias[1].id, 65);
    EXPECT_EQ(bias[1].amount, -0.5f);
    EXPECT_EQ(bias[2].id, 200);
    EXPECT_EQ(bias[2].amount, -5.0f);
  }
  expect_bad(with(kCompletion, {{"logit_bias", {1, 2}}}), "logit_bias");
  expect_bad(with(kCompletion, {{"logit_bias", {{"abc", 1}}}}), "logit_bias");
  expect_bad(with(kCompletion, {{"logit_bias", {{"-1", 1}}}}), "logit_bias");
  expect_bad(with(kCompletion, {{"logit_bias", {{"258", 1}}}}), "logit_bias");  // the vocabulary is 258
  expect_bad(with(kCompletion, {{"logit_bias", {{"5", 1}, {"05", 2}}}}), "logit_bias");
  expect_bad(with(kCompletion, {{"logit_bias", {{"5", 100.5}}}}), "logit_bias.5");
  expect_bad(with(kCompletion, {{"logit_bias", {{"5", "high"}}}}), "logit_bias.5");
  ProtocolLimits few = test_limits();
  few.max_logit_bias = 1;
  const json two = with(kCompletion, {{"logit_bias", {{"1", 1}, {"2", 1}}}});
  EXPECT_EQ(error_of([&] { parse_completion_request(two.dump(), ApiDialect::completions, few); }).param(),
            "logit_bias");
}

TEST(OpenAiProtocol, ModelMustBeTheServedOne) {
  ApiError e = error_of([] { parse(with(kCompletion, {{"model", "gpt-4"}})); });
  EXPECT_EQ(e.http_status(), 404);
  EXPECT_EQ(e.type(), "invalid_request_error");
  EXPECT_EQ(e.code(), "model_not_found");
  EXPECT_EQ(e.param(), "model");
  expect_bad(with(kCompletion, {{"model", 3}}), "model");
  json no_model = kCompletion;
  no_model.erase("model");
  EXPECT_EQ(parse(no_model).model, "smol");  // like vLLM: the one served model
}

TEST(OpenAiProtocol, PromptForms) {
  EXPECT_EQ(std::get<std::string>(parse(with(kCompletion, {{"prompt", {"one"}}})).prompt), "one");
  EXPECT_EQ(std::get<std::vector<int32_t>>(parse(with(kCompletion, {{"prompt", {1, 2, 257}}})).prompt),
            (std::vector<int32_t>{1, 2, 257}));
  EXPECT_EQ(std::get<std::vector<int32_t>>(parse(with(kCompletion, {{"prompt", {{5, 6}}}})).prompt),
            (std::vector<int32_t>{5, 6}));
}

TEST(OpenAiProtocol, ABatchOfPromptsIsOneRequestPerPrompt) {
  const json body =
      with(kCompletion, {{"prompt", {"one", {5, 6}, "three"}}, {"n", 2}, {"max_tokens", 3}, {"echo", true}});
  std::vector<ParsedCompletion> batch = parse_batch(body);
  ASSERT_EQ(batch.size(), 3u);
  EXPECT_EQ(std::get<std::string>(batch[0].prompt), "one");
  EXPECT_EQ(std::get<std::vector<int32_t>>(batch[1].prompt), (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(std::get<std::string>(batch[2].prompt), "three");
  for (size_t i = 0; i < batch.size(); ++i) {
    EXPECT_EQ(batch[i].prompt_param, "prompt[" + std::to_string(i) + "]");
    EXPECT_EQ(batch[i].request.n, 2);
    EXPECT_EQ(batch[i].request.sampling.max_tokens, 3);
    EXPECT_TRUE(batch[i].echo);
  }
  EXPECT_EQ(parse(with(kCompletion, {{"prompt", {"one"}}})).prompt_param, "prompt");

  ProtocolLimits limits = test_limits();
  limits.max_prompts = 2;
  ApiError e = error_of([&] { parse_completion_request(body.dump(), ApiDialect::completions, limits); });
  EXPECT_EQ(e.param(), "prompt");
  EXPECT_NE(std::string(e.what()).find("at most 2"), std::string::npos) << e.what();

  // Each prompt is encoded alone; the context names the prompt an error is about, and echoes each one's own.
  Tokenizer tokenizer = byte_tokenizer();
  ChatTemplate chatml(ChatTemplateKind::chatml);
  for (ParsedCompletion& prompt : batch) encode_prompt(prompt, tokenizer, chatml, test_limits());
  EXPECT_EQ(batch[1].request.prompt_ids, (std::vector<int32_t>{5, 6}));
  const ResponseContext context = make_response_context(batch, chatml, 1700000000);
  EXPECT_EQ(context.n, 6);
  EXPECT_EQ(context.n_per_prompt, 2);
  EXPECT_EQ(echo_text(context, 1), "one");
  EXPECT_EQ(echo_text(context, 2), tokenizer.decode(std::vector<int32_t>{5, 6}, /*skip_special=*/false));
  EXPECT_EQ(echo_text(context, 5), "three");
  std::vector<ParsedCompletion> long_one = parse_batch(with(kCompletion, {{"prompt", {"a", std::string(64, 'a')}}}));
  e = error_of([&] { encode_prompt(long_one[1], tokenizer, chatml, test_limits()); });
  EXPECT_EQ(e.param(), "prompt[1]");
  EXPECT_NE(std::string(e.what()).find("prompt[1] is 64 tokens"), std::string::npos) << e.what();
}

TEST(OpenAiProtocol, PromptErrors) {
  json missing = kCompletion;
  missing.erase("prompt");
  expect_bad(missing, "prompt");
  expect_bad(with(kCompletion, {{"prompt", 42}}), "prompt");
  expect_bad(with(kCompletion, {{"prompt", json::array()}}), "prompt");
  expect_bad(with(kCompletion, {{"prompt", {1, "a"}}}), "prompt");
  EXPECT_NE(std::string(error_of([] { parse(with(kCompletion, {{"prompt", {1, "a"}}})); }).what())
                .find("expected token ids (integers), got string"),
            std::string::npos);
  expect_bad(with(kCompletion, {{"prompt", {1, 258}}}), "prompt");  // outside the vocabulary
  expect_bad(with(kCompletion, {{"prompt", {-1}}}), "prompt");
  expect_bad(with(kCompletion, {{"prompt", {1.5}}}), "prompt");

  expect_bad(with(kCompletion, {{"prompt", {json::array()}}}), "prompt");
  expect_bad(with(kCompletion, {{"prompt", {"one", 2}}}), "prompt[1]");  // a batch names the prompt
  expect_bad(with(kCompletion, {{"prompt", {{1}, {2, 258}}}}), "prompt[1]");
  expect_bad(with(kCompletion, {{"prompt", {"one", json::array()}}}), "prompt[1]");
  expect_bad(with(kCompletion, {{"prompt", json(std::vector<std::string>(65, "a"))}}), "prompt");  // max_prompts

  ApiError e = error_of([] { parse(with(kCompletion, {{"prompt", {1, 300}}})); });
  EXPECT_NE(std::string(e.what()).find("300"), std::string::npos) << e.what();
}

TEST(OpenAiProtocol, ChatMessages) {
  ParsedCompletion p = parse_chat(with(kChat, {{"messages",
                                                {{{"role", "developer"}, {"content", "Be brief."}},
                                                 {{"role", "user"},
                                                  {"content", {{{"type", "text"}, {"text", "a"}},
                                                               {{"type", "text"}, {"text", "b"}}}}},
                                                 {{"role", "assistant"}, {"content", nullptr}},
                                                 {{"role", "user"}, {"content", "c"}, {"name", "bob"}}}}}));
  const auto& messages = std::get<std::vector<ChatMessage>>(p.prompt);
  ASSERT_EQ(messages.size(), 4u);
  EXPECT_EQ(messages[0].role, "system");
  EXPECT_EQ(messages[0].content, "Be brief.");
  EXPECT_EQ(messages[1].content, "a\nb");
  EXPECT_EQ(messages[2].role, "assistant");
  EXPECT_EQ(messages[2].content, "");
  EXPECT_EQ(messages[3].content, "c");
}

TEST(OpenAiProtocol, ChatMessageErrors) {
  json missing = kChat;
  missing.erase("messages");
  expect_bad_chat(missing, "messages");
  expect_bad_chat(with(kChat, {{"messages", json::array()}}), "messages");
  expect_bad_chat(with(kChat, {{"messages", "hi"}}), "messages");
  expect_bad_chat(with(kChat, {{"messages", {"hi"}}}), "messages[0]");
  expect_bad_chat(with(kChat, {{"messages", {{{"content", "x"}}}}}), "messages[0].role");
  expect_bad_chat(with(kChat, {{"messages", {{{"role", "user"}, {"content", "x"}}, {{"role", "tool"}, {"content", "x"}}}}}),
                  "messages[1].tool_call_id");
  expect_bad_chat(with(kChat, {{"messages", {{{"role", "user"}, {"content", "x"}}, {{"role", "robot"}, {"content", "x"}}}}}),
                  "messages[1].role");
  expect_bad_chat(with(kChat, {{"messages", {{{"role", 1}, {"content", "x"}}}}}), "messages[0].role");
  expect_bad_chat(with(kChat, {{"messages", {{{"role", "user"}}}}}), "messages[0].content");
  expect_bad_chat(with(kChat, {{"messages", {{{"role", "user"}, {"content", 5}}}}}), "messages[0].content");
  expect_bad_chat(with(kChat, {{"messages", {{{"role", "user"},
                                              {"content", {{{"type", "text"}, {"text", "a"}},
                                                           {{"type", "image_url"}, {"image_url", "x"}}}}}}}}),
                  "messages[0].content[1].type");
  expect_bad_chat(with(kChat, {{"messages", {{{"role", "user"}, {"content", {{{"type", "text"}}}}}}}}),
                  "messages[0].content[0].text");
}

TEST(OpenAiProtocol, MaxTokens) {
  expect_bad(with(kCompletion, {{"max_tokens", 0}}), "max_tokens");
  expect_bad(with(kCompletion, {{"max_tokens", -5}}), "max_tokens");
  expect_bad(with(kCompletion, {{"max_tokens", 65}}), "max_tokens");  // more than the context of 64
  expect_bad(with(kCompletion, {{"max_tokens", 1e30}}), "max_tokens");
  expect_bad(with(kCompletion, {{"max_tokens", 18446744073709551615ull}}), "max_tokens");
  expect_bad(with(kCompletion, {{"max_tokens", "10"}}), "max_tokens");
  EXPECT_EQ(parse(with(kCompletion, {{"max_tokens", 64}})).request.sampling.max_tokens, 64);

  // Chat: max_completion_tokens wins over the deprecated max_tokens, and errors name the field used.
  EXPECT_EQ(parse_chat(with(kChat, {{"max_tokens", 5}, {"max_completion_tokens", 9}})).request.sampling.max_tokens, 9);
  EXPECT_EQ(parse_chat(with(kChat, {{"max_tokens", 5}})).request.sampling.max_tokens, 5);
  expect_bad_chat(with(kChat, {{"max_completion_tokens", 0}}), "max_completion_tokens");
  expect_bad_chat(with(kChat, {{"max_tokens", 100}}), "max_tokens");
}

TEST(OpenAiProtocol, SamplingRanges) {
  for (double t : {-0.1, 2.01}) expect_bad(with(kCompletion, {{"temperature", t}}), "temperature");
  expect_bad(with(kCompletion, {{"temperature", "hot"}}), "temperature");
  expect_bad(with(kCompletion, {{"temperature", true}}), "temperature");
  EXPECT_EQ(parse(with(kCompletion, {{"temperature", 2}})).request.sampling.temperature, 2.0f);

  for (double p : {0.0, 1.01, -1.0}) expect_bad(with(kCompletion, {{"top_p", p}}), "top_p");
  EXPECT_EQ(parse(with(kCompletion, {{"top_p", 1}})).request.sampling.top_p, 1.0f);

  expect_bad(with(kCompletion, {{"top_k", -2}}), "top_k");
  expect_bad(with(kCompletion, {{"top_k", 2.5}}), "top_k");
  EXPECT_EQ(parse(with(kCompletion, {{"top_k", -1}})).request.sampling.top_k, 0);  // -1 and 0 both mean off
  EXPECT_EQ(parse(with(kCompletion, {{"top_k", 0}})).request.sampling.top_k, 0);

  for (double m : {-0.1, 1.1}) expect_bad(with(kCompletion, {{"min_p", m}}), "min_p");
  EXPECT_EQ(parse(with(kCompletion, {{"min_p", 1}})).request.sampling.min_p, 1.0f);

  for (const char* field : {"presence_penalty", "frequency_penalty"}) {
    expect_bad(with(kCompletion, {{field, 2.5}}), field);
    expect_bad(with(kCompletion, {{field, -2.5}}), field);
    expect_bad(with(kCompletion, {{field, "1"}}), field);
  }

  expect_bad(with(kCompletion, {{"seed", "42"}}), "seed");
  expect_bad(with(kCompletion, {{"seed", 4.2}}), "seed");
  EXPECT_EQ(parse(with(kCompletion, {{"seed", -1}})).request.sampling.seed, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(parse(with(kCompletion, {{"seed", 18446744073709551615ull}})).request.sampling.seed,
            std::numeric_limits<uint64_t>::max());

  expect_bad(with(kCompletion, {{"ignore_eos", 1}}), "ignore_eos");
}

TEST(OpenAiProtocol, ChoicesPerRequest) {
  expect_bad(with(kCompletion, {{"n", 0}}), "n");
  expect_bad(with(kCompletion, {{"n", 17}}), "n");
  EXPECT_EQ(parse(with(kCompletion, {{"n", 16}})).request.n, 16);
  ProtocolLimits limits = test_limits();
  limits.max_n = 2;
  ApiError e = error_of([&] {
    parse_completion_request(with(kCompletion, {{"n", 3}}).dump(), ApiDialect::completions, limits);
  });
  EXPECT_EQ(e.param(), "n");

  // No more choices in all than the engine queues: such a request could never start.
  limits = test_limits();
  limits.max_sequences = 8;
  EXPECT_NO_THROW(parse_completion_request(with(kCompletion, {{"n", 8}}).dump(), ApiDialect::completions, limits));
  e = error_of([&] {
    parse_completion_request(with(kCompletion, {{"n", 9}}).dump(), ApiDialect::completions, limits);
  });
  EXPECT_EQ(e.param(), "n");
  EXPECT_NE(std::string(e.what()).find("(8)"), std::string::npos) << e.what();
  EXPECT_NO_THROW(parse_completion_request(with(kCompletion, {{"n", 4}, {"prompt", {"a", "b"}}}).dump(),
                                           ApiDialect::completions, limits));
  e = error_of([&] {
    parse_completion_request(with(kCompletion, {{"n", 3}, {"prompt", {"a", "b", "c"}}}).dump(),
                             ApiDialect::completions, limits);
  });
  EXPECT_EQ(e.param(), "prompt");
  EXPECT_NE(std::string(e.what()).find("3 choices for each of 3 prompts"), std::string::npos) << e.what();
}

TEST(OpenAiProtocol, MinTokensIsAtMostMaxTokensAndNotUnderAGrammar) {
  EXPECT_EQ(parse(with(kCompletion, {{"min_tokens", 3}})).request.sampling.min_tokens, 3);
  expect_bad(with(kCompletion, {{"min_tokens", -1}}), "min_tokens");
  expect_bad(with(kCompletion, {{"min_tokens", "3"}}), "min_tokens");
  Tokenizer tokenizer = byte_tokenizer();
  ChatTemplate chatml(ChatTemplateKind::chatml);
  ParsedCompletion p = parse(with(kCompletion, {{"min_tokens", 17}}));  // completions' default max_tokens is 16
  EXPECT_EQ(error_of([&] { encode_prompt(p, tokenizer, chatml, test_limits()); }).param(), "min_tokens");
  p = parse(with(kCompletion, {{"min_tokens", 16}}));
  EXPECT_NO_THROW(encode_prompt(p, tokenizer, chatml, test_limits()));
  p = parse(with(kChat, {{"min_tokens", 2}, {"response_format", {{"type", "json_object"}}}}), ApiDialect::chat);
  EXPECT_EQ(error_of([&] { encode_prompt(p, tokenizer, chatml, test_limits()); }).param(), "min_tokens");
}

TEST(OpenAiProtocol, StopStrings) {
  EXPECT_EQ(parse(with(kCompletion, {{"stop", "x"}})).request.sampling.stop, std::vector<std::string>{"x"});
  expect_bad(with(kCompletion, {{"stop", {"a", "b", "c", "d", "e"}}}), "stop");
  expect_bad(with(kCompletion, {{"stop", {1}}}), "stop");
  expect_bad(with(kCompletion, {{"stop", ""}}), "stop");
  expect_bad(with(kCompletion, {{"stop", 7}}), "stop");
}

TEST(OpenAiProtocol, LogprobsInBothDialects) {
  // Completions: an integer 0..20.
  EXPECT_EQ(parse(with(kCompletion, {{"logprobs", 0}})).request.sampling.n_logprobs, 0);
  EXPECT_EQ(parse(with(kCompletion, {{"logprobs", 20}})).request.sampling.n_logprobs, 20);
  expect_bad(with(kCompletion, {{"logprobs", 21}}), "logprobs");
  expect_bad(with(kCompletion, {{"logprobs", -1}}), "logprobs");
  expect_bad(with(kCompletion, {{"logprobs", true}}), "logprobs");

  // Chat: a boolean, plus top_logprobs 0..20 that needs it.
  ParsedCompletion p = parse_chat(with(kChat, {{"logprobs", true}, {"top_logprobs", 3}}));
  EXPECT_EQ(p.request.sampling.n_logprobs, 3);
  EXPECT_TRUE(p.logprobs);
  EXPECT_EQ(parse_chat(with(kChat, {{"logprobs", true}})).request.sampling.n_logprobs, 0);
  EXPECT_EQ(parse_chat(with(kChat, {{"logprobs", false}})).request.sampling.n_logprobs, -1);
  expect_bad_chat(with(kChat, {{"logprobs", 5}}), "logprobs");
  expect_bad_chat(with(kChat, {{"logprobs", true}, {"top_logprobs", 21}}), "top_logprobs");
  expect_bad_chat(with(kChat, {{"logprobs", true}, {"top_logprobs", -1}}), "top_logprobs");
  expect_bad_chat(with(kChat, {{"top_logprobs", 2}}), "top_logprobs");
}

TEST(OpenAiProtocol, StreamOptionsAndEcho) {
  ParsedCompletion p = parse(with(kCompletion, {{"stream", true}, {"stream_options", {{"include_usage", true}}}}));
  EXPECT_TRUE(p.stream);
  EXPECT_TRUE(p.include_usage);
  expect_bad(with(kCompletion, {{"stream", "yes"}}), "stream");
  expect_bad(with(kCompletion, {{"stream_options", {{"include_usage", true}}}}), "stream_options");
  expect_bad(with(kCompletion, {{"stream", true}, {"stream_options", {{"include_usage", 1}}}}),
             "stream_options.include_usage");

  EXPECT_TRUE(parse(with(kCompletion, {{"echo", true}})).echo);
  expect_bad(with(kCompletion, {{"echo", true}, {"logprobs", 2}}), "echo");
}

TEST(OpenAiProtocol, KvCompressionExtension) {
  EXPECT_EQ(parse(with(kCompletion, {{"kv_compression", {{"policy", "full"}}}})).request.kv_policy,
            (PolicySpec{"full", {}}));
  expect_bad(with(kCompletion, {{"kv_compression", {{"policy", "snapkv"}}}}), "kv_compression.policy");
  expect_bad(with(kCompletion, {{"kv_compression", json::object()}}), "kv_compression.policy");
  expect_bad(with(kCompletion, {{"kv_compression", {{"policy", 1}}}}), "kv_compression.policy");
  expect_bad(with(kCompletion, {{"kv_compression", "full"}}), "kv_compression");
  expect_bad_chat(with(kChat, {{"kv_compression", {{"policy", "h2o"}}}}), "kv_compression.policy");

  // Parameters arrive in the spec the ranks receive, as text; a bad one is named.
  ProtocolLimits limits = test_limits();
  limits.kv_policies.push_back("snapkv");
  const json body = with(kCompletion, {{"kv_compression", {{"policy", "snapkv"}, {"budget", 64}, {"window", 8}}}});
  EXPECT_EQ(parse_completion_request(body.dump(), ApiDialect::completions, limits).at(0).request.kv_policy,
            (PolicySpec{"snapkv", {{"budget", "64"}, {"window", "8"}}}));
  try {
    parse_completion_request(with(kCompletion, {{"kv_compression", {{"policy", "snapkv"}, {"budget", -3}}}}).dump(),
                             ApiDialect::completions, limits);
    ADD_FAILURE() << "a negative budget was accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param(), "kv_compression.budget");
  }
}

// A policy valid in itself that the engine cannot run (check_kv_policy throws) is a 400 on kv_compression.policy.
TEST(OpenAiProtocol, KvCompressionTheEngineCannotRun) {
  ProtocolLimits limits = test_limits();
  limits.kv_policies = {"full", "pod"};
  limits.check_kv_policy = [](const PolicySpec& spec) {
    if (spec.name == "pod") throw std::invalid_argument("policy pod: needs kv_cache.pod_blocks");
  };
  const json pod = with(kCompletion, {{"kv_compression", {{"policy", "pod"}}}});
  const ApiError e = error_of([&] { parse_completion_request(pod.dump(), ApiDialect::completions, limits); });
  EXPECT_EQ(e.http_status(), 400);
  EXPECT_EQ(e.param(), "kv_compression.policy");
  EXPECT_NE(std::string(e.what()).find("kv_cache.pod_blocks"), std::string::npos) << e.what();
  const json full = with(kCompletion, {{"kv_compression", {{"policy", "full"}}}});
  EXPECT_NO_THROW(parse_completion_request(full.dump(), ApiDialect::completions, limits));
}

// ---------------------------------------------------------------------------------------------------------------
// Encoding the prompt

TEST(OpenAiProtocol, EncodesTextPromptAndDefaultsMaxTokens) {
  Tokenizer tokenizer = byte_tokenizer();
  ChatTemplate chatml(ChatTemplateKind::chatml);
  ProtocolLimits limits = test_limits();

  ParsedCompletion p = parse(with(kCompletion, {{"prompt", "Hello"}}));
  encode_prompt(p, tokenizer, chatml, limits);
  EXPECT_EQ(p.request.prompt_ids, (std::vector<int32_t>{'H', 'e', 'l', 'l', 'o'}));
  EXPECT_EQ(p.request.sampling.max_tokens, 16);  // OpenAI's completions default

  // User text never turns into control tokens.
  p = parse(with(kCompletion, {{"prompt", "<|im_end|>"}}));
  encode_prompt(p, tokenizer, chatml, limits);
  EXPECT_EQ(p.request.prompt_ids.size(), 10u);

  // Near the end of the context the default shrinks to what is left.
  p = parse(with(kCompletion, {{"prompt", std::string(60, 'a')}}));
  encode_prompt(p, tokenizer, chatml, limits);
  EXPECT_EQ(p.request.sampling.max_tokens, 4);
}

TEST(OpenAiProtocol, EncodesChatThroughTheTemplate) {
  Tokenizer tokenizer = byte_tokenizer();
  ChatTemplate chatml(ChatTemplateKind::chatml);
  ParsedCompletion p = parse_chat(kChat);
  encode_prompt(p, tokenizer, chatml, test_limits());
  // "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n" with the control tokens as single ids.
  std::vector<int32_t> expected = {kImStart, 'u', 's', 'e', 'r', '\n', 'H', 'i', kImEnd, '\n',
                                   kImStart, 'a', 's', 's', 'i', 's', 't', 'a', 'n', 't', '\n'};
  EXPECT_EQ(p.request.prompt_ids, expected);
  EXPECT_EQ(p.request.sampling.max_tokens, 64 - int(expected.size()));  // chat default: the rest of the context
}

TEST(OpenAiProtocol, PromptMustFitTheContext) {
  Tokenizer tokenizer = byte_tokenizer();
  ChatTemplate chatml(ChatTemplateKind::chatml);
  ProtocolLimits limits = test_limits();

  ParsedCompletion p = parse(with(kCompletion, {{"prompt", std::string(64, 'a')}}));
  ApiError e = error_of([&] { encode_prompt(p, tokenizer, chatml, limits); });
  EXPECT_EQ(e.http_status(), 400);
  EXPECT_EQ(e.param(), "prompt");
  EXPECT_NE(std::string(e.what()).find("64 tokens"), std::string::npos) << e.what();

  p = parse(with(kCompletion, {{"prompt", std::vector<int>(70, 1)}}));
  e = error_of([&] { encode_prompt(p, tokenizer, chatml, limits); });
  EXPECT_NE(std::string(e.what()).find("70"), std::string::npos) << e.what();

  p = parse_chat(with(kChat, {{"messages", {{{"role", "user"}, {"content", std::string(60, 'x')}}}}}));
  e = error_of([&] { encode_prompt(p, tokenizer, chatml, limits); });
  EXPECT_EQ(e.param(), "messages");

  // Prompt plus max_tokens beyond the context, as OpenAI rejects it.
  p = parse(with(kCompletion, {{"prompt", std::string(40, 'a')}, {"max_tokens", 30}}));
  e = error_of([&] { encode_prompt(p, tokenizer, chatml, limits); });
  EXPECT_EQ(e.param(), "max_tokens");
  EXPECT_NE(std::string(e.what()).find("70"), std::string::npos) << e.what();

  p = parse(with(kCompletion, {{"prompt", ""}}));
  e = error_of([&] { encode_prompt(p, tokenizer, chatml, limits); });
  EXPECT_EQ(e.param(), "prompt");
}

TEST(OpenAiProtocol, TokenIdPromptPassesThroughAndEchoDecodes) {
  Tokenizer tokenizer = byte_tokenizer();
  ChatTemplate chatml(ChatTemplateKind::chatml);
  ParsedCompletion p = parse(with(kCompletion, {{"prompt", {'O', 'k'}}, {"echo", true}}));
  encode_prompt(p, tokenizer, chatml, test_limits());
  EXPECT_EQ(p.request.prompt_ids, (std::vector<int32_t>{'O', 'k'}));
  EXPECT_EQ(p.echo_text, "Ok");
}

TEST(OpenAiProtocol, RequestIds) {
  std::string a = make_request_id(ApiDialect::completions);
  std::string b = make_request_id(ApiDialect::completions);
  EXPECT_EQ(a.rfind("cmpl-", 0), 0u);
  EXPECT_EQ(a.size(), 5u + 24u);
  EXPECT_NE(a, b);
  EXPECT_EQ(make_request_id(ApiDialect::chat).rfind("chatcmpl-", 0), 0u);
}

// ---------------------------------------------------------------------------------------------------------------
// Responses

TEST(ApiErrorBody, HasTheOpenAiShape) {
  EXPECT_EQ(json::parse(ApiError::invalid_request("top_p", "bad").body()),
            json::parse(R"({"error": {"message": "bad", "type": "invalid_request_error", "param": "top_p",
                                      "code": null}})"));
  EXPECT_EQ(json::parse(ApiError(404, "invalid_request_error", "no", "model", "model_not_found").body()),
            json::parse(R"({"error": {"message": "no", "type": "invalid_request_error", "param": "model",
                                      "code": "model_not_found"}})"));
  EXPECT_EQ(json::parse(ApiError::internal("boom").body())["error"]["param"], nullptr);
}

ResponseContext context_for(ApiDialect dialect, int n = 1, bool logprobs = false) {
  ResponseContext context;
  context.dialect = dialect;
  context.id = dialect == ApiDialect::chat ? "chatcmpl-1" : "cmpl-1";
  context.model = "smol";
  context.created = 1700000000;
  context.n = n;
  context.n_per_prompt = n;
  context.logprobs = logprobs;
  return context;
}

LogprobEntry entry(std::string token, int32_t id, float logprob, std::vector<std::pair<std::string, float>> top) {
  return LogprobEntry{std::move(token), id, logprob, std::move(top)};
}

// Splits "data: X\n\n" events; checks the framing on the way.
std::vector<std::string> sse_data(const std::string& text) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < text.size()) {
    EXPECT_EQ(text.compare(pos, 6, "data: "), 0) << text.substr(pos);
    size_t end = text.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos);
    if (end == std::string::npos) break;
    out.push_back(text.substr(pos + 6, end - pos - 6));
    pos = end + 2;
  }
  return out;
}

TEST(CompletionCollector, BuildsATextCompletionWithLogprobs) {
  CompletionCollector collector(context_for(ApiDialect::completions, 1, true));
  collector.add(ChoiceDelta{0, "Hi", {10}, {entry("Hi", 10, -0.5f, {{"Hi", -0.5f}, {"Yo", -1.25f}})}});
  collector.add(ChoiceDelta{0, " there", {11}, {entry(" there", 11, -0.25f, {{" there", -0.25f}})}});
  EXPECT_FALSE(collector.done());
  collector.add(ChoiceFinished{0, FinishReason::length});
  collector.add(RequestFinished{Usage{5, 2}});
  EXPECT_TRUE(collector.done());
  EXPECT_FALSE(collector.failure());
  json expected = json::parse(R"({
    "id": "cmpl-1", "object": "text_completion", "created": 1700000000, "model": "smol",
    "choices": [{"index": 0, "text": "Hi there",
                 "logprobs": {"tokens": ["Hi", " there"], "token_logprobs": [-0.5, -0.25],
                              "top_logprobs": [{"Hi": -0.5, "Yo": -1.25}, {" there": -0.25}],
                              "text_offset": [0, 2]},
                 "finish_reason": "length"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7,
              "prompt_tokens_details": {"cached_tokens": 0}}})");
  EXPECT_EQ(json::parse(collector.body()), expected);
}

TEST(CompletionCollector, BuildsAChatCompletionWithLogprobsAndRawBytes) {
  CompletionCollector collector(context_for(ApiDialect::chat, 2, true));
  // "\xe2\x82" is the first two bytes of the euro sign: invalid UTF-8 on its own, U+FFFD in "token".
  collector.add(ChoiceDelta{1, "B", {7}, {entry("B", 7, -0.1f, {{"B", -0.1f}, {"\xe2\x82", -3.0f}})}});
  collector.add(ChoiceDelta{0, "A", {6}, {entry("A", 6, -std::numeric_limits<float>::infinity(), {})}});
  collector.add(ChoiceFinished{0, FinishReason::stop});
  collector.add(ChoiceFinished{1, FinishReason::stop});
  collector.add(RequestFinished{Usage{3, 2, 2}});
  json expected = json::parse(R"({
    "id": "chatcmpl-1", "object": "chat.completion", "created": 1700000000, "model": "smol",
    "choices": [
      {"index": 0, "message": {"role": "assistant", "content": "A"},
       "logprobs": {"content": [{"token": "A", "logprob": -9999.0, "bytes": [65], "top_logprobs": []}]},
       "finish_reason": "stop"},
      {"index": 1, "message": {"role": "assistant", "content": "B"},
       "logprobs": {"content": [{"token": "B", "logprob": -0.1, "bytes": [66],
                                 "top_logprobs": [{"token": "B", "logprob": -0.1, "bytes": [66]},
                                                  {"token": "\ufffd", "logprob": -3.0, "bytes": [226, 130]}]}]},
       "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
              "prompt_tokens_details": {"cached_tokens": 2}}})");
  EXPECT_EQ(json::parse(collector.body()), expected);
}

TEST(CompletionCollector, EchoAndMissingFinishReason) {
  ResponseContext context = context_for(ApiDialect::completions);
  context.echo_texts = {"Q: "};
  CompletionCollector collector(context);
  collector.add(ChoiceDelta{0, "A", {1}, {}});
  collector.add(RequestFinished{Usage{2, 1}});
  json body = json::parse(collector.body());
  EXPECT_EQ(body["choices"][0]["text"], "Q: A");
  EXPECT_EQ(body["choices"][0]["logprobs"], nullptr);
  EXPECT_EQ(body["choices"][0]["finish_reason"], nullptr);
}

TEST(CompletionCollector, ABatchsChoicesEchoTheirOwnPrompts) {
  ResponseContext context = context_for(ApiDialect::completions, 4);
  context.n_per_prompt = 2;
  context.echo_texts = {"A:", "B:"};
  CompletionCollector collector(context);
  for (int i = 0; i < 4; ++i) collector.add(ChoiceDelta{i, std::to_string(i), {1}, {}});
  collector.add(RequestFinished{Usage{4, 4}});
  json body = json::parse(collector.body());
  ASSERT_EQ(body["choices"].size(), 4u);
  EXPECT_EQ(body["choices"][1]["text"], "A:1");
  EXPECT_EQ(body["choices"][2]["text"], "B:2");
  EXPECT_EQ(body["choices"][3]["index"], 3);
}

TEST(CompletionCollector, FailureAndBadChoice) {
  CompletionCollector collector(context_for(ApiDialect::completions));
  EXPECT_THROW(collector.add(ChoiceDelta{1, "x", {}, {}}), std::out_of_range);
  collector.add(RequestFailed{Failure::not_started, "engine stopped"});
  EXPECT_TRUE(collector.done());
  ASSERT_TRUE(collector.failure());
  EXPECT_EQ(collector.failure()->why, Failure::not_started);
}

TEST(StreamEncoder, TextCompletionChunks) {
  ResponseContext context = context_for(ApiDialect::completions, 1, true);
  context.include_usage = true;
  StreamEncoder encoder(context);
  EXPECT_EQ(encoder.begin(), "");
  std::string out = encoder.encode(ChoiceDelta{0, "Hi", {10}, {entry("Hi", 10, -0.5f, {{"Hi", -0.5f}})}});
  out += encoder.encode(ChoiceDelta{0, "!", {11}, {entry("!", 11, -1.0f, {{"!", -1.0f}})}});
  out += encoder.encode(ChoiceFinished{0, FinishReason::stop});
  EXPECT_FALSE(encoder.done());
  out += encoder.encode(RequestFinished{Usage{4, 2}});
  EXPECT_TRUE(encoder.done());

  std::vector<std::string> events = sse_data(out);
  ASSERT_EQ(events.size(), 5u);
  EXPECT_EQ(json::parse(events[0]), json::parse(R"({
    "id": "cmpl-1", "object": "text_completion", "created": 1700000000, "model": "smol",
    "choices": [{"index": 0, "text": "Hi",
                 "logprobs": {"tokens": ["Hi"], "token_logprobs": [-0.5], "top_logprobs": [{"Hi": -0.5}],
                              "text_offset": [0]},
                 "finish_reason": null}],
    "usage": null})"));
  EXPECT_EQ(json::parse(events[1])["choices"][0]["logprobs"]["text_offset"], json::array({2}));  // continues
  EXPECT_EQ(json::parse(events[2]), json::parse(R"({
    "id": "cmpl-1", "object": "text_completion", "created": 1700000000, "model": "smol",
    "choices": [{"index": 0, "text": "", "logprobs": null, "finish_reason": "stop"}], "usage": null})"));
  EXPECT_EQ(json::parse(events[3]), json::parse(R"({
    "id": "cmpl-1", "object": "text_completion", "created": 1700000000, "model": "smol", "choices": [],
    "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6,
              "prompt_tokens_details": {"cached_tokens": 0}}})"));
  EXPECT_EQ(events[4], "[DONE]");
  EXPECT_TRUE(out.ends_with("data: [DONE]\n\n"));
}

TEST(StreamEncoder, ChatChunks) {
  StreamEncoder encoder(context_for(ApiDialect::chat, 2, true));
  std::vector<std::string> opening = sse_data(encoder.begin());
  ASSERT_EQ(opening.size(), 2u);  // a role chunk for each choice
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(json::parse(opening[i]), json({{"id", "chatcmpl-1"},
                                             {"object", "chat.completion.chunk"},
                                             {"created", 1700000000},
                                             {"model", "smol"},
                                             {"choices",
                                              {{{"index", i},
                                                {"delta", {{"role", "assistant"}, {"content", ""}}},
                                                {"logprobs", nullptr},
                                                {"finish_reason", nullptr}}}}}));
  }
  std::vector<std::string> events = sse_data(
      encoder.encode(ChoiceDelta{1, "Yo", {5}, {entry("Yo", 5, -0.5f, {{"Yo", -0.5f}})}}) +
      encoder.encode(ChoiceDelta{1, "", {6}, {}}) +  // nothing to say: no chunk
      encoder.encode(ChoiceFinished{1, FinishReason::length}) + encoder.encode(RequestFinished{Usage{1, 1}}));
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(json::parse(events[0]), json::parse(R"({
    "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1700000000, "model": "smol",
    "choices": [{"index": 1, "delta": {"content": "Yo"},
                 "logprobs": {"content": [{"token": "Yo", "logprob": -0.5, "bytes": [89, 111],
                                           "top_logprobs": [{"token": "Yo", "logprob": -0.5, "bytes": [89, 111]}]}]},
                 "finish_reason": null}]})"));
  EXPECT_EQ(json::parse(events[1]), json::parse(R"({
    "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1700000000, "model": "smol",
    "choices": [{"index": 1, "delta": {}, "logprobs": null, "finish_reason": "length"}]})"));
  EXPECT_EQ(events[2], "[DONE]");  // no usage chunk unless asked for
}

TEST(StreamEncoder, EchoOpensEachChoiceWithThePrompt) {
  ResponseContext context = context_for(ApiDialect::completions, 2);
  context.echo_texts = {"Q:"};
  StreamEncoder encoder(context);
  std::vector<std::string> events = sse_data(encoder.begin());
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(json::parse(events[1])["choices"][0]["text"], "Q:");
  EXPECT_EQ(json::parse(events[1])["choices"][0]["index"], 1);
}

TEST(StreamEncoder, FailureBecomesAnErrorEvent) {
  StreamEncoder encoder(context_for(ApiDialect::chat));
  EXPECT_THROW(encoder.encode(ChoiceFinished{3, FinishReason::stop}), std::out_of_range);
  std::vector<std::string> events = sse_data(encoder.encode(RequestFailed{Failure::step_failed, "out of memory"}));
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(json::parse(events[0]), json::parse(R"({"error": {"message": "out of memory", "type": "server_error",
                                                              "param": null, "code": null}})"));
  EXPECT_EQ(events[1], "[DONE]");
  EXPECT_TRUE(encoder.done());
}

TEST(Sse, Framing) {
  EXPECT_EQ(sse_event("{}"), "data: {}\n\n");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
}

}  // namespace
}  // namespace strata
