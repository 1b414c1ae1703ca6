// Tools in the chat templates: how each family renders the tool list, an assistant's calls and the results, the
// call syntax a forced call is constrained to, and reading a model's answer back into calls (docs/tool-calls.md).
#include <gtest/gtest.h>

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/chat_template.h"
#include "model/tool_definitions.h"

namespace strata {
namespace {

using Messages = std::vector<ChatMessage>;
using Tools = std::vector<ToolDefinition>;
using OrderedJson = nlohmann::ordered_json;

Tools weather_tools() {
  return {ToolDefinition{"get_weather", "Current weather in a city",
                         OrderedJson::parse(R"({"type": "object", "properties": {"city": {"type": "string"}},
                                                "required": ["city"]})")}};
}

// The tool as the templates that list it on one line write it (Python's json.dumps, keys in the given order).
constexpr const char* kWeatherToolLine =
    R"({"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city", )"
    R"("parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})";

// System, a question, the assistant's call, the tool's result: the prompt asks for the answer after the result.
Messages weather_conversation() {
  ChatMessage call{"assistant", ""};
  call.tool_calls = {ToolCall{"call_1", "get_weather", R"({"city":"Paris"})"}};
  ChatMessage result{"tool", "18 C, sunny"};
  result.tool_call_id = "call_1";
  return {{"system", "Be brief."}, {"user", "Weather in Paris?"}, call, result};
}

// Runs `action`, which must throw std::invalid_argument whose message starts with `field` and a colon.
void expect_field_error(const std::function<void()>& action, const std::string& field) {
  try {
    action();
    ADD_FAILURE() << "no error; expected one naming " << field;
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind(field + ": ", 0), 0u) << e.what();
  }
}

// ---- Rendering --------------------------------------------------------------------------------------------------

TEST(ChatTemplateTools, ChatMlRendersHermesStyleToolsCallsAndResponses) {
  const ChatTemplate chatml(ChatTemplateKind::chatml, std::string(kSmolLm2SystemPrompt));
  EXPECT_EQ(chatml.render(weather_conversation(), weather_tools(), true),
            std::string("<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to help answer "
                        "the user. The functions' signatures are listed inside <tools></tools>, one per line:\n"
                        "<tools>\n") +
                kWeatherToolLine +
                "\n</tools>\n\nTo call a function, answer with one JSON object per call, holding the function's name "
                "and its arguments, each inside <tool_call></tool_call> tags:\n<tool_call>\n{\"name\": "
                "<function-name>, \"arguments\": <arguments-as-a-JSON-object>}\n</tool_call><|im_end|>\n"
                "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
                "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                "\"Paris\"}}\n</tool_call><|im_end|>\n"
                "<|im_start|>user\n<tool_response>\n18 C, sunny\n</tool_response><|im_end|>\n"
                "<|im_start|>assistant\n");
}

TEST(ChatTemplateTools, ChatMlPutsTheToolsAfterTheDefaultSystemPromptAndGroupsResults) {
  const ChatTemplate chatml(ChatTemplateKind::chatml, std::string(kSmolLm2SystemPrompt));
  ChatMessage calls{"assistant", "Checking both."};
  calls.tool_calls = {ToolCall{"a", "get_weather", R"({"city": "Paris"})"},
                      ToolCall{"b", "get_weather", R"({"city": "Oslo"})"}};
  ChatMessage first{"tool", "18"};
  first.tool_call_id = "a";
  ChatMessage second{"tool", "4"};
  second.tool_call_id = "b";
  const std::string prompt = chatml.render(Messages{{"user", "Paris or Oslo?"}, calls, first, second}, weather_tools(),
                                           false);
  EXPECT_EQ(prompt.rfind("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
                         "Face\n\n# Tools\n\n", 0),
            0u)
      << prompt;
  EXPECT_NE(prompt.find("</tool_call><|im_end|>\n<|im_start|>user\nParis or Oslo?"), std::string::npos) << prompt;
  const std::string tail =
      "<|im_start|>assistant\nChecking both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n"
      "</tool_call><|im_end|>\n"
      "<|im_start|>user\n<tool_response>\n18\n</tool_response>\n<tool_response>\n4\n</tool_response><|im_end|>\n";
  EXPECT_TRUE(prompt.ends_with(tail)) << prompt;
  // Without a default system prompt, the system turn holds only the tools.
  EXPECT_EQ(ChatTemplate(ChatTemplateKind::chatml).render(Messages{{"user", "Hi"}}, weather_tools(), true)
                .rfind("<|im_start|>system\n# Tools\n\n", 0),
            0u);
}

TEST(ChatTemplateTools, Llama3RendersJsonToolCallingWithTheIpythonRole) {
  const ChatTemplate llama3 = ChatTemplate::from_name("llama3");
  EXPECT_EQ(llama3.render(weather_conversation(), weather_tools(), true),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n\nBe brief."
            "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
            "Given the following functions, please respond with a JSON for a function call with its proper arguments "
            "that best answers the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": "
            "dictionary of argument name and its value}. Do not use variables.\n\n"
            "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_weather\",\n"
            "        \"description\": \"Current weather in a city\",\n        \"parameters\": {\n"
            "            \"type\": \"object\",\n            \"properties\": {\n                \"city\": {\n"
            "                    \"type\": \"string\"\n                }\n            },\n"
            "            \"required\": [\n                \"city\"\n            ]\n        }\n    }\n}\n\n"
            "Weather in Paris?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"get_weather\", \"parameters\": {\"city\": "
            "\"Paris\"}}<|eot_id|>"
            "<|start_header_id|>ipython<|end_header_id|>\n\n18 C, sunny<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // No system message: the system turn is the environment line alone.
  EXPECT_EQ(llama3.render(Messages{{"user", "Hi"}}, weather_tools(), false)
                .rfind("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython<|eot_id|>"
                       "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions",
                       0),
            0u);
}

TEST(ChatTemplateTools, MistralRendersV3ToolTokens) {
  const ChatTemplate mistral = ChatTemplate::from_name("mistral");
  EXPECT_EQ(mistral.render(weather_conversation(), weather_tools(), true),
            std::string("<s>[AVAILABLE_TOOLS] [") + kWeatherToolLine +
                "][/AVAILABLE_TOOLS][INST] Be brief.\n\nWeather in Paris? [/INST]"
                "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"call_1\"}]"
                "</s>[TOOL_RESULTS] {\"content\": \"18 C, sunny\", \"call_id\": \"call_1\"}[/TOOL_RESULTS]");
}

TEST(ChatTemplateTools, MistralPutsTheToolsBeforeTheLastUserMessageAndJsonResultsAsJson) {
  const ChatTemplate mistral = ChatTemplate::from_name("mistral");
  Messages messages = weather_conversation();
  messages[3].content = R"({"celsius":18})";
  messages.push_back({"assistant", "18 C."});
  messages.push_back({"user", "Thanks"});
  EXPECT_EQ(mistral.render(messages, weather_tools(), true),
            "<s>[INST] Be brief.\n\nWeather in Paris? [/INST]"
            "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"call_1\"}]</s>"
            "[TOOL_RESULTS] {\"content\": {\"celsius\": 18}, \"call_id\": \"call_1\"}[/TOOL_RESULTS]18 C.</s>"
            "[AVAILABLE_TOOLS] [" +
                std::string(kWeatherToolLine) + "][/AVAILABLE_TOOLS][INST] Thanks [/INST]");
}

TEST(ChatTemplateTools, ToolMessagesRenderWithoutToolDefinitions) {
  // A conversation may replay calls and results without offering tools again.
  EXPECT_EQ(ChatTemplate::from_name("llama3").render(weather_conversation(), false),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nWeather in Paris?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"get_weather\", \"parameters\": {\"city\": "
            "\"Paris\"}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n18 C, sunny<|eot_id|>");
  EXPECT_EQ(ChatTemplate::from_name("chatml").render(weather_conversation(), Tools{}, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n"
            "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
            "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n18 C, sunny\n</tool_response><|im_end|>\n");
}

TEST(ChatTemplateTools, NoToolsRendersAsBefore) {
  const Messages plain = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello"}, {"user", "Bye"}};
  for (const char* name : {"chatml", "llama3", "mistral"}) {
    const ChatTemplate chat_template = ChatTemplate::from_name(name, "Default.");
    EXPECT_EQ(chat_template.render(plain, Tools{}, true), chat_template.render(plain, true)) << name;
  }
}

// ---- Errors that name the field -----------------------------------------------------------------------------

TEST(ChatTemplateTools, MalformedToolMessagesNameTheField) {
  const ChatTemplate chatml = ChatTemplate::from_name("chatml");
  const auto render = [&](Messages messages) { return [=] { chatml.render(messages, weather_tools(), true); }; };
  Messages bad = weather_conversation();
  bad[2].tool_calls[0].arguments = "{city: Paris}";
  expect_field_error(render(bad), "messages[2].tool_calls[0].function.arguments");
  bad[2].tool_calls[0].arguments = R"(["Paris"])";
  expect_field_error(render(bad), "messages[2].tool_calls[0].function.arguments");
  bad = weather_conversation();
  bad[2].tool_calls[0].name = "";
  expect_field_error(render(bad), "messages[2].tool_calls[0].function.name");
  bad = weather_conversation();
  bad[2].tool_calls[0].id = "";
  expect_field_error(render(bad), "messages[2].tool_calls[0].id");
  bad = weather_conversation();
  bad[3].tool_call_id = "";
  expect_field_error(render(bad), "messages[3].tool_call_id");
  bad[3].tool_call_id = "call_9";
  expect_field_error(render(bad), "messages[3].tool_call_id");
  bad = weather_conversation();
  bad.erase(bad.begin() + 2);  // a result that answers no call
  expect_field_error(render(bad), "messages[2].role");
  bad = weather_conversation();
  bad[1].tool_calls = bad[2].tool_calls;  // a user message cannot call
  expect_field_error(render(bad), "messages[1].tool_calls");
  bad = weather_conversation();
  bad[1].tool_call_id = "call_1";
  expect_field_error(render(bad), "messages[1].tool_call_id");
  bad = weather_conversation();
  bad[1].role = "wizard";
  expect_field_error(render(bad), "messages[1].role");
}

TEST(ChatTemplateTools, BadToolDefinitionsNameTheField) {
  const ChatTemplate chatml = ChatTemplate::from_name("chatml");
  Tools tools = weather_tools();
  tools[0].name = "";
  expect_field_error([&] { chatml.render(Messages{{"user", "Hi"}}, tools, true); }, "tools[0].function.name");
  tools = weather_tools();
  tools.push_back(tools[0]);
  expect_field_error([&] { chatml.render(Messages{{"user", "Hi"}}, tools, true); }, "tools[1].function.name");
  tools = weather_tools();
  tools[0].parameters = "object";
  expect_field_error([&] { chatml.render(Messages{{"user", "Hi"}}, tools, true); }, "tools[0].function.parameters");
}

TEST(ChatTemplateTools, OrdersATemplateCannotExpress) {
  const ChatTemplate llama3 = ChatTemplate::from_name("llama3");
  Messages two_calls = weather_conversation();
  two_calls[2].tool_calls.push_back(ToolCall{"call_2", "get_weather", "{}"});
  expect_field_error([&] { llama3.render(two_calls, weather_tools(), true); }, "messages[2].tool_calls");
  expect_field_error([&] { llama3.render(Messages{{"system", "x"}, {"assistant", "Hi"}}, weather_tools(), true); },
                     "messages[1].role");
  expect_field_error([&] { llama3.render(Messages{{"system", "x"}}, weather_tools(), true); }, "messages");

  const ChatTemplate mistral = ChatTemplate::from_name("mistral");
  Messages user_after_result = weather_conversation();
  user_after_result.push_back({"user", "And Oslo?"});
  expect_field_error([&] { mistral.render(user_after_result, weather_tools(), true); }, "messages[4].role");
  Messages user_after_call = weather_conversation();
  user_after_call[3] = {"user", "never mind"};
  expect_field_error([&] { mistral.render(user_after_call, weather_tools(), true); }, "messages[3].role");
  expect_field_error([&] { mistral.render(Messages{{"system", "x"}}, weather_tools(), true); }, "messages");
}

// ---- The call syntax and reading calls back -----------------------------------------------------------------

// One call written exactly as the syntax says: what a forced call is constrained to produce.
std::string call_in_syntax(const ToolCallSyntax& syntax, const std::string& name, const std::string& arguments) {
  return syntax.prefix + "{\"name\": \"" + name + "\", \"" + syntax.arguments_key + "\": " + arguments + "}" +
         syntax.suffix;
}

TEST(ChatTemplateTools, SyntaxPerTemplate) {
  const ToolCallSyntax chatml = ChatTemplate::from_name("chatml").tool_call_syntax();
  EXPECT_EQ(chatml.prefix, "<tool_call>\n");
  EXPECT_EQ(chatml.suffix, "\n</tool_call>");
  EXPECT_EQ(chatml.arguments_key, "arguments");
  EXPECT_EQ(chatml.repetition, ToolCallRepetition::blocks);
  const ToolCallSyntax llama3 = ChatTemplate::from_name("llama3").tool_call_syntax();
  EXPECT_EQ(llama3.prefix + llama3.suffix, "");
  EXPECT_EQ(llama3.arguments_key, "parameters");
  EXPECT_EQ(llama3.repetition, ToolCallRepetition::single);
  const ToolCallSyntax mistral = ChatTemplate::from_name("mistral").tool_call_syntax();
  EXPECT_EQ(mistral.prefix, "[TOOL_CALLS] [");
  EXPECT_EQ(mistral.suffix, "]");
  EXPECT_EQ(mistral.arguments_key, "arguments");
  EXPECT_EQ(mistral.repetition, ToolCallRepetition::list_items);
  EXPECT_EQ(mistral.separator, ", ");
}

TEST(ChatTemplateTools, ACallInTheSyntaxParsesBack) {
  for (const char* name : {"chatml", "llama3", "mistral"}) {
    const ChatTemplate chat_template = ChatTemplate::from_name(name);
    const std::string text = call_in_syntax(chat_template.tool_call_syntax(), "get_weather",
                                            R"({"city": "Paris", "days": 3, "units": {"t": "C"}})");
    const auto calls = chat_template.parse_tool_calls(text);
    ASSERT_TRUE(calls.has_value()) << name << ": " << text;
    ASSERT_EQ(calls->size(), 1u) << name;
    EXPECT_EQ((*calls)[0].name, "get_weather") << name;
    EXPECT_EQ((*calls)[0].arguments, R"({"city":"Paris","days":3,"units":{"t":"C"}})") << name;  // compact, in order
    // Whitespace around the text and between the pieces does not matter.
    EXPECT_TRUE(chat_template.parse_tool_calls("\n  " + text + " \n").has_value()) << name;
  }
  EXPECT_TRUE(ChatTemplate::from_name("chatml")
                  .parse_tool_calls(R"(<tool_call>{"name": "f", "arguments": {}}</tool_call>)")
                  .has_value());
  EXPECT_TRUE(ChatTemplate::from_name("mistral")
                  .parse_tool_calls(R"([TOOL_CALLS][ {"name": "f", "arguments": {}} ])")
                  .has_value());
}

TEST(ChatTemplateTools, ACallAsRenderedInAPromptParsesBack) {
  // What each template writes for an earlier call is what the model is expected to write.
  ChatMessage call{"assistant", ""};
  call.tool_calls = {ToolCall{"call_1", "get_weather", R"({"city": "Paris"})"}};
  const Messages messages = {{"user", "Weather?"}, call};
  const std::string chatml = ChatTemplate::from_name("chatml").render(messages, false);
  const size_t start = chatml.find("<tool_call>");
  const auto chatml_calls =
      ChatTemplate::from_name("chatml").parse_tool_calls(chatml.substr(start, chatml.rfind("<|im_end|>") - start));
  ASSERT_TRUE(chatml_calls.has_value()) << chatml;
  EXPECT_EQ((*chatml_calls)[0].arguments, R"({"city":"Paris"})");
  const std::string mistral = ChatTemplate::from_name("mistral").render(messages, false);
  const size_t at = mistral.find("[TOOL_CALLS]");
  const auto mistral_calls =  // with the "id" the prompt gives earlier calls
      ChatTemplate::from_name("mistral").parse_tool_calls(mistral.substr(at, mistral.rfind("</s>") - at));
  ASSERT_TRUE(mistral_calls.has_value()) << mistral;
  EXPECT_EQ((*mistral_calls)[0].name, "get_weather");
}

TEST(ChatTemplateTools, SeveralCallsWhereTheSyntaxAllows) {
  const auto chatml = ChatTemplate::from_name("chatml").parse_tool_calls(
      "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>");
  ASSERT_TRUE(chatml.has_value());
  ASSERT_EQ(chatml->size(), 2u);
  EXPECT_EQ((*chatml)[0].name, "a");
  EXPECT_EQ((*chatml)[0].arguments, R"({"x":1})");
  EXPECT_EQ((*chatml)[1].name, "b");
  EXPECT_EQ((*chatml)[1].arguments, "{}");

  const auto mistral = ChatTemplate::from_name("mistral").parse_tool_calls(
      R"([TOOL_CALLS] [{"name": "a", "arguments": {"x": "]"}}, {"name": "b", "arguments": {}, "id": "abc123xyz"}])");
  ASSERT_TRUE(mistral.has_value());
  ASSERT_EQ(mistral->size(), 2u);
  EXPECT_EQ((*mistral)[0].arguments, R"({"x":"]"})");
  EXPECT_EQ((*mistral)[1].name, "b");

  EXPECT_FALSE(ChatTemplate::from_name("llama3")
                   .parse_tool_calls(R"({"name": "a", "parameters": {}} {"name": "b", "parameters": {}})")
                   .has_value());
}

TEST(ChatTemplateTools, NearMissesAreContent) {
  const ChatTemplate chatml = ChatTemplate::from_name("chatml");
  for (const char* text : {
           "The weather is fine.",
           "",
           "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}",                          // no suffix
           "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call> Done.",      // text after
           "Sure: <tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",      // text before
           "<tool_call>\n{\"name\": \"f\", \"arguments\": {city: 1}}\n</tool_call>",     // not JSON
           "<tool_call>\n{\"name\": \"f\", \"arguments\": {}\n</tool_call>",             // unbalanced
           "<tool_call>\n{\"arguments\": {}}\n</tool_call>",                             // no name
           "<tool_call>\n{\"name\": \"\", \"arguments\": {}}\n</tool_call>",             // empty name
           "<tool_call>\n{\"name\": 5, \"arguments\": {}}\n</tool_call>",                // name not a string
           "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",                               // no arguments
           "<tool_call>\n{\"name\": \"f\", \"arguments\": \"{}\"}\n</tool_call>",        // arguments as a string
           "<tool_call>\n{\"name\": \"f\", \"parameters\": {}}\n</tool_call>",           // Llama's key
           "<tool_call>\n{\"name\": \"f\", \"arguments\": {}, \"id\": \"x\"}\n</tool_call>",  // an extra key
           "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\nand <tool_call>",
       }) {
    EXPECT_FALSE(chatml.parse_tool_calls(text).has_value()) << text;
  }
  const ChatTemplate llama3 = ChatTemplate::from_name("llama3");
  for (const char* text : {"{\"name\": \"f\", \"arguments\": {}}", "{\"name\": \"f\", \"parameters\": {}}.",
                           "Call: {\"name\": \"f\", \"parameters\": {}}", "[{\"name\": \"f\", \"parameters\": {}}]",
                           "{\"name\": \"f\", \"parameters\": []}"}) {
    EXPECT_FALSE(llama3.parse_tool_calls(text).has_value()) << text;
  }
  const ChatTemplate mistral = ChatTemplate::from_name("mistral");
  for (const char* text : {"[{\"name\": \"f\", \"arguments\": {}}]",                    // no [TOOL_CALLS]
                           "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {}}",         // no closing bracket
                           "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {}},]",       // trailing separator
                           "[TOOL_CALLS] []",                                            // no call
                           "[TOOL_CALLS] {\"name\": \"f\", \"arguments\": {}}",          // not a list
                           "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {}, \"id\": 7}]"}) {
    EXPECT_FALSE(mistral.parse_tool_calls(text).has_value()) << text;
  }
}

TEST(ChatTemplateTools, CallSchemaForOneOrSeveralTools) {
  const Tools tools = weather_tools();
  const ToolCallSyntax llama3 = ChatTemplate::from_name("llama3").tool_call_syntax();
  EXPECT_EQ(llama3.call_schema(tools).dump(),
            R"({"type":"object","properties":{"name":{"const":"get_weather"},"parameters":{"type":"object",)"
            R"("properties":{"city":{"type":"string"}},"required":["city"]}},"required":["name","parameters"],)"
            R"("additionalProperties":false})");
  Tools two = tools;
  two.push_back(ToolDefinition{"now", "", nullptr});
  const OrderedJson either = ChatTemplate::from_name("chatml").tool_call_syntax().call_schema(two);
  ASSERT_EQ(either["anyOf"].size(), 2u);
  EXPECT_EQ(either["anyOf"][1]["properties"].dump(),
            R"({"name":{"const":"now"},"arguments":{"type":"object","properties":{}}})");
  EXPECT_THROW(llama3.call_schema(Tools{}), std::invalid_argument);
}

// ---- OpenAI's tools array -------------------------------------------------------------------------------------

TEST(ToolDefinitions, ParsesOpenAiTools) {
  const Tools tools = parse_tool_definitions(OrderedJson::parse(R"([
      {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
       "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
       "strict": true}},
      {"type": "function", "function": {"name": "now", "description": null}}])"));
  ASSERT_EQ(tools.size(), 2u);
  EXPECT_EQ(tools[0].name, "get_weather");
  EXPECT_EQ(tools[0].description, "Current weather in a city");
  EXPECT_TRUE(tools[0].strict);
  EXPECT_EQ(tools[0].parameters.dump(),  // the client's key order
            R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})");
  EXPECT_EQ(tools[1].name, "now");
  EXPECT_TRUE(tools[1].parameters.is_null());
  EXPECT_EQ(openai_tool_json(tools[1]).dump(), R"({"type":"function","function":{"name":"now"}})");
  // From nlohmann::json (keys sorted), as the HTTP layer may hold the request.
  const Tools sorted = parse_tool_definitions(nlohmann::json::parse(
      R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}])"));
  EXPECT_EQ(sorted[0].parameters.dump(), R"({"properties":{},"type":"object"})");
}

TEST(ToolDefinitions, ErrorsNameTheField) {
  const auto parse = [](const char* text) { return [=] { parse_tool_definitions(OrderedJson::parse(text)); }; };
  expect_field_error(parse(R"({"type": "function"})"), "tools");
  expect_field_error(parse(R"(["f"])"), "tools[0]");
  expect_field_error(parse(R"([{"function": {"name": "f"}}])"), "tools[0].type");
  expect_field_error(parse(R"([{"type": "retrieval", "function": {"name": "f"}}])"), "tools[0].type");
  expect_field_error(parse(R"([{"type": "function"}])"), "tools[0].function");
  expect_field_error(parse(R"([{"type": "function", "function": {"name": "f"}, "extra": 1}])"), "tools[0].extra");
  expect_field_error(parse(R"([{"type": "function", "function": {}}])"), "tools[0].function.name");
  expect_field_error(parse(R"([{"type": "function", "function": {"name": "get weather"}}])"),
                     "tools[0].function.name");
  expect_field_error(parse(R"([{"type": "function", "function": {"name": 3}}])"), "tools[0].function.name");
  expect_field_error(parse(R"([{"type": "function", "function": {"name": "f", "parameters": "x"}}])"),
                     "tools[0].function.parameters");
  expect_field_error(parse(R"([{"type": "function", "function": {"name": "f", "strict": "yes"}}])"),
                     "tools[0].function.strict");
  expect_field_error(parse(R"([{"type": "function", "function": {"name": "f", "returns": {}}}])"),
                     "tools[0].function.returns");
  expect_field_error(parse(R"([{"type": "function", "function": {"name": "f"}},
                                {"type": "function", "function": {"name": "f"}}])"),
                     "tools[1].function.name");
}

}  // namespace
}  // namespace strata
