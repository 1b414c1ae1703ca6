// response_format, tools and tool_choice: their parsing and errors, the grammar a request decodes under, and
// answers read back as tool calls, whole and streamed.
#include "routing/output_format.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "grammar/grammar_matcher.h"
#include "routing/api_error.h"
#include "routing/openai_protocol.h"
#include "routing/tool_call_output.h"

namespace strata {
namespace {

using json = nlohmann::ordered_json;

const json kChat = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}};
const json kWeather = {{"type", "function"},
                       {"function",
                        {{"name", "get_weather"},
                         {"parameters",
                          {{"type", "object"},
                           {"properties", {{"city", {{"type", "string"}}}}},
                           {"required", {"city"}}}}}}};
const json kTime = {{"type", "function"}, {"function", {{"name", "get_time"}}}};

json with(json body, const json& extra) {
  for (const auto& [key, value] : extra.items()) body[key] = value;
  return body;
}

OutputFormat format_of(const json& body, ApiDialect dialect = ApiDialect::chat) {
  return parse_output_format(body, dialect);
}

// The param of the ApiError that parsing `body` and compiling its grammar throws ("" when nothing is thrown).
std::string error_param(const json& body) {
  try {
    output_grammar(format_of(body), ChatTemplate(ChatTemplateKind::chatml).tool_call_syntax());
  } catch (const ApiError& e) {
    EXPECT_EQ(e.http_status(), 400);
    return e.param();
  }
  return "";
}

bool grammar_matches(const json& body, std::string_view text) {
  const auto grammar = output_grammar(format_of(body), ChatTemplate(ChatTemplateKind::chatml).tool_call_syntax());
  if (!grammar) return false;
  grammar::GrammarMatcher matcher(grammar);
  return matcher.advance(text) && matcher.is_complete();
}

TEST(OutputFormat, ResponseFormats) {
  EXPECT_FALSE(format_of(kChat).json_schema);
  EXPECT_FALSE(format_of(with(kChat, {{"response_format", {{"type", "text"}}}})).json_schema);
  const json json_mode = with(kChat, {{"response_format", {{"type", "json_object"}}}});
  EXPECT_TRUE(grammar_matches(json_mode, R"({"a":[1,{"b":null}]})"));
  EXPECT_FALSE(grammar_matches(json_mode, "[1]"));
  const json schema = {{"type", "object"}, {"properties", {{"n", {{"type", "integer"}, {"maximum", 5}}}}},
                       {"required", {"n"}}};
  const json json_schema =
      with(kChat, {{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "n"}, {"schema", schema},
                                                                                   {"strict", true}}}}}});
  EXPECT_TRUE(grammar_matches(json_schema, R"({"n":5})"));
  EXPECT_FALSE(grammar_matches(json_schema, R"({"n":6})"));
  // The completions dialect takes response_format too (as vLLM does).
  EXPECT_TRUE(format_of(with(json::object(), {{"response_format", {{"type", "json_object"}}}}),
                        ApiDialect::completions).json_schema);
}

TEST(OutputFormat, ResponseFormatErrorsNameTheField) {
  EXPECT_EQ(error_param(with(kChat, {{"response_format", "json"}})), "response_format");
  EXPECT_EQ(error_param(with(kChat, {{"response_format", {{"type", "yaml"}}}})), "response_format.type");
  EXPECT_EQ(error_param(with(kChat, {{"response_format", {{"type", "json_object"}, {"schema", 1}}}})),
            "response_format.schema");
  EXPECT_EQ(error_param(with(kChat, {{"response_format", {{"type", "json_schema"}}}})), "response_format.json_schema");
  EXPECT_EQ(error_param(with(kChat, {{"response_format", {{"type", "json_schema"}, {"json_schema", {{"schema", json::object()}}}}}})),
            "response_format.json_schema.name");
  const json bad_minimum = {{"type", "object"}, {"properties", {{"age", {{"type", "integer"}, {"minimum", "ten"}}}}}};
  EXPECT_EQ(error_param(with(kChat, {{"response_format", {{"type", "json_schema"},
                                                          {"json_schema", {{"name", "p"}, {"schema", bad_minimum}}}}}})),
            "response_format.json_schema.schema/properties/age/minimum");
}

TEST(OutputFormat, ToolChoices) {
  const json tools = with(kChat, {{"tools", {kWeather, kTime}}});
  EXPECT_EQ(format_of(kChat).tool_choice, ToolChoice::none);
  EXPECT_EQ(format_of(tools).tool_choice, ToolChoice::automatic);  // OpenAI's default with tools
  EXPECT_EQ(format_of(tools).prompt_tools().size(), 2u);
  EXPECT_TRUE(format_of(with(tools, {{"tool_choice", "none"}})).prompt_tools().empty());
  const OutputFormat named =
      format_of(with(tools, {{"tool_choice", {{"type", "function"}, {"function", {{"name", "get_time"}}}}}}));
  EXPECT_EQ(named.tool_choice, ToolChoice::named);
  ASSERT_EQ(named.prompt_tools().size(), 1u);
  EXPECT_EQ(named.prompt_tools()[0].name, "get_time");
  // auto leaves the answer free; required and a named tool constrain it to one call in the template's syntax.
  EXPECT_EQ(output_grammar(format_of(tools), ChatTemplate(ChatTemplateKind::chatml).tool_call_syntax()), nullptr);
  const json required = with(tools, {{"tool_choice", "required"}});
  EXPECT_TRUE(grammar_matches(required, "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}\n</tool_call>"));
  EXPECT_TRUE(grammar_matches(required, "<tool_call>\n{\"name\":\"get_time\",\"arguments\":{}}\n</tool_call>"));
  EXPECT_FALSE(grammar_matches(required, "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{}}\n</tool_call>"));
  EXPECT_FALSE(grammar_matches(required, "{\"name\":\"get_time\",\"arguments\":{}}"));
  EXPECT_FALSE(grammar_matches(with(tools, {{"tool_choice", {{"type", "function"}, {"function", {{"name", "get_time"}}}}}}),
                               "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}\n</tool_call>"));
}

TEST(OutputFormat, ToolErrorsNameTheField) {
  const json tools = with(kChat, {{"tools", {kWeather, kTime}}});
  EXPECT_EQ(error_param(with(kChat, {{"tool_choice", "required"}})), "tool_choice");
  EXPECT_EQ(error_param(with(tools, {{"tool_choice", "sometimes"}})), "tool_choice");
  EXPECT_EQ(error_param(with(tools, {{"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}})),
            "tool_choice.function.name");
  EXPECT_EQ(error_param(with(tools, {{"tool_choice", {{"type", "function"}}}})), "tool_choice.function");
  EXPECT_EQ(error_param(with(tools, {{"parallel_tool_calls", "yes"}})), "parallel_tool_calls");
  EXPECT_EQ(error_param(with(kChat, {{"tools", {{{"type", "function"}, {"function", {{"name", "a b"}}}}}}})),
            "tools[0].function.name");
  EXPECT_EQ(error_param(with(tools, {{"response_format", {{"type", "json_object"}}}})), "response_format");
  json bad_parameters = kTime;
  bad_parameters["function"]["parameters"] = {{"type", "object"}, {"properties", {{"zone", {{"$ref", "#/x"}}}}}};
  EXPECT_EQ(error_param(with(kChat, {{"tools", {kWeather, bad_parameters}}, {"tool_choice", "required"}})),
            "tools[1].function.parameters/properties/zone/$ref");
}

ResponseContext chat_context(int n = 1) {
  static const ChatTemplate chatml(ChatTemplateKind::chatml);
  ResponseContext context;
  context.dialect = ApiDialect::chat;
  context.id = "chatcmpl-1";
  context.model = "smol";
  context.n = n;
  context.tool_calls.emplace(chatml, std::vector<std::string>{"get_weather"});
  return context;
}

const std::string kCall = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";

json collected(const std::vector<std::string>& texts, const std::vector<FinishReason>& reasons) {
  CompletionCollector collector(chat_context(int(texts.size())));
  for (size_t i = 0; i < texts.size(); ++i) {
    collector.add(ChoiceDelta{int(i), texts[i], {}, {}});
    collector.add(ChoiceFinished{int(i), reasons[i]});
  }
  collector.add(RequestFinished{});
  return json::parse(collector.body());
}

TEST(ToolCallOutput, WholeAnswersThatAreCallsComeBackAsToolCalls) {
  const json body = collected({kCall, "It is sunny.", kCall.substr(0, 30),
                               "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>"},
                              {FinishReason::stop, FinishReason::stop, FinishReason::length, FinishReason::stop});
  const json& call = body["choices"][0];
  EXPECT_EQ(call["finish_reason"], "tool_calls");
  EXPECT_TRUE(call["message"]["content"].is_null());
  ASSERT_EQ(call["message"]["tool_calls"].size(), 1u);
  const json& function = call["message"]["tool_calls"][0]["function"];
  EXPECT_EQ(function["name"], "get_weather");
  EXPECT_EQ(json::parse(function["arguments"].get<std::string>()), json({{"city", "Oslo"}}));
  EXPECT_TRUE(call["message"]["tool_calls"][0]["id"].get<std::string>().starts_with("call_"));
  EXPECT_EQ(body["choices"][1]["message"]["content"], "It is sunny.");
  EXPECT_EQ(body["choices"][1]["finish_reason"], "stop");
  EXPECT_EQ(body["choices"][2]["finish_reason"], "length");  // a call cut short stays text
  EXPECT_EQ(body["choices"][3]["message"]["content"].get<std::string>().substr(0, 11), "<tool_call>");  // not offered
}

// The data of each server-sent event, parsed.
std::vector<json> events_of(const std::string& stream) {
  std::vector<json> out;
  for (size_t at = stream.find("data: "); at != std::string::npos; at = stream.find("data: ", at + 1)) {
    const size_t end = stream.find("\n\n", at);
    const std::string data = stream.substr(at + 6, end - at - 6);
    if (data != "[DONE]") out.push_back(json::parse(data));
  }
  return out;
}

TEST(ToolCallOutput, AStreamHoldsACallBackAndSendsItWhole) {
  StreamEncoder encoder(chat_context());
  std::string stream = encoder.begin();
  for (size_t at = 0; at < kCall.size(); at += 7) {
    const std::string piece = encoder.encode(ChoiceDelta{0, kCall.substr(at, 7), {}, {}});
    EXPECT_EQ(piece, "") << "held back: " << kCall.substr(0, at + 7);
  }
  stream += encoder.encode(ChoiceFinished{0, FinishReason::stop});
  const std::vector<json> events = events_of(stream);
  ASSERT_EQ(events.size(), 3u);  // the role, the calls, the finish
  const json& call = events[1]["choices"][0]["delta"]["tool_calls"][0];
  EXPECT_EQ(call["index"], 0);
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(events[2]["choices"][0]["finish_reason"], "tool_calls");
}

TEST(ToolCallOutput, AStreamReleasesTextOnceItCannotBeACall) {
  StreamEncoder encoder(chat_context());
  encoder.begin();
  EXPECT_EQ(encoder.encode(ChoiceDelta{0, " <tool", {}, {}}), "");  // may still be a call
  const std::vector<json> released = events_of(encoder.encode(ChoiceDelta{0, "s are", {}, {}}));
  ASSERT_EQ(released.size(), 1u);
  EXPECT_EQ(released[0]["choices"][0]["delta"]["content"], " <tools are");
  const std::vector<json> next = events_of(encoder.encode(ChoiceDelta{0, " fun", {}, {}}));
  ASSERT_EQ(next.size(), 1u);  // streamed at once from here on
  EXPECT_EQ(next[0]["choices"][0]["delta"]["content"], " fun");
  const std::vector<json> last = events_of(encoder.encode(ChoiceFinished{0, FinishReason::stop}));
  ASSERT_EQ(last.size(), 1u);
  EXPECT_EQ(last[0]["choices"][0]["finish_reason"], "stop");
}

TEST(ToolCallOutput, AHeldAnswerThatIsNoCallGoesOutAtTheEnd) {
  StreamEncoder encoder(chat_context());
  encoder.begin();
  EXPECT_EQ(encoder.encode(ChoiceDelta{0, "<tool_call>\n{\"name\": ", {}, {}}), "");
  const std::vector<json> events = events_of(encoder.encode(ChoiceFinished{0, FinishReason::length}));
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0]["choices"][0]["delta"]["content"], "<tool_call>\n{\"name\": ");
  EXPECT_EQ(events[1]["choices"][0]["finish_reason"], "length");
}

}  // namespace
}  // namespace strata
