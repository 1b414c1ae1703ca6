#pragma once
// The two OpenAI dialects, /v1/completions and /v1/chat/completions: request bodies parsed and validated into a
// GenerationRequest, and response bodies (one JSON document, or server-sent events) built from GenerationEvents.
// Fields Strata does not answer get 400 (routing/request_fields.h).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "leader/generation.h"
#include "model/chat_template.h"
#include "routing/json_fields.h"
#include "routing/output_format.h"
#include "routing/protocol_limits.h"
#include "routing/tool_call_output.h"

namespace strata {

class Tokenizer;

enum class ApiDialect { completions, chat };

// A prompt as the request gave it: text (completions), token ids (completions), or messages (chat).
using PromptInput = std::variant<std::string, std::vector<int32_t>, std::vector<ChatMessage>>;

struct ParsedCompletion {
  ApiDialect dialect = ApiDialect::completions;
  std::string model;              // the served model id
  PromptInput prompt;
  std::string prompt_param;       // what its errors name: "messages", "prompt", or "prompt[i]" in a batch
  GenerationRequest request;      // sampling, n, kv_policy; encode_prompt fills prompt_ids; id and sink are the caller's
  bool stream = false;
  bool include_usage = false;     // stream_options.include_usage
  bool echo = false;              // completions: the prompt is written before each choice's text
  bool logprobs = false;          // the response carries logprobs (request.sampling.n_logprobs >= 0)
  bool max_tokens_given = false;
  std::string max_tokens_param;   // "max_tokens" or "max_completion_tokens": the field errors name
  std::string echo_text;          // set by encode_prompt when echo
  OutputFormat output_format;     // response_format, tools, tool_choice
};

// 404 model_not_found unless name is the served model's.
void check_model_name(const std::string& name, const ProtocolLimits& limits);

// The model a request body names (404 model_not_found for another), or the served one when it names none.
const std::string& requested_model(const RequestJson& root, const ProtocolLimits& limits);

// Parses and validates a request body into one ParsedCompletion per prompt: a batch of completions prompts
// ("prompt": ["a", "b"]) gives one for each, otherwise the same; the server runs them as separate engine requests
// answered as one response (routing/prompt_batch.h). Throws ApiError: 400 naming the field, 404 for a model not
// served.
std::vector<ParsedCompletion> parse_completion_request(std::string_view body, ApiDialect dialect,
                                                       const ProtocolLimits& limits);

// The ids generation sees for the prompt: messages rendered through the template with the request's tools (and
// the assistant's generation prompt when add_generation_prompt), then tokenized with control tokens parsed; text
// tokenized as user text (control-token strings stay text); both with the model's BOS first where it adds one and
// add_special. Token ids as given. Throws ApiError for messages the template cannot render.
std::vector<int32_t> prompt_token_ids(const ParsedCompletion& parsed, const Tokenizer& tokenizer,
                                      const ChatTemplate& chat_template, bool add_generation_prompt = true,
                                      bool add_special = true);

// Turns the prompt into token ids (prompt_token_ids), checks them against the context and
// fills max_tokens when the request left it out (completions: 16, chat: the rest of the context), and compiles the
// grammar a response_format or a forced tool call decodes under (request.grammar). Throws ApiError.
void encode_prompt(ParsedCompletion& parsed, const Tokenizer& tokenizer, const ChatTemplate& chat_template,
                   const ProtocolLimits& limits);

// "cmpl-<24 hex>" or "chatcmpl-<24 hex>"; unique within the process.
std::string make_request_id(ApiDialect dialect);

// What every response object repeats.
struct ResponseContext {
  ApiDialect dialect = ApiDialect::completions;
  std::string id;
  std::string model;
  int64_t created = 0;        // unix seconds
  int n = 1;                  // choices in all: each prompt's in turn (prompt i's choice j is i * n_per_prompt + j)
  int n_per_prompt = 1;       // the request's n
  bool logprobs = false;
  bool include_usage = false;
  std::vector<std::string> echo_texts;  // completions with echo: per prompt, written before each of its choices' text
  std::optional<ToolCallReader> tool_calls;  // chat with tools: answers that are calls come back as tool_calls
};

// batch: a request's prompts, encoded, and with their id; chat_template: the server's, which parses tool calls (it
// must outlive the context).
ResponseContext make_response_context(const std::vector<ParsedCompletion>& batch, const ChatTemplate& chat_template,
                                      int64_t created);

// The echo written before a choice's text ("" without echo).
const std::string& echo_text(const ResponseContext& context, int choice);

// A non-streaming response: collects a request's events, then builds the completion / chat.completion body.
class CompletionCollector {
 public:
  explicit CompletionCollector(ResponseContext context);
  // Throws std::out_of_range for a choice index the request does not have (an engine bug -> 500).
  void add(const GenerationEvent& event);
  bool done() const { return finished_ || failure_.has_value(); }
  const std::optional<RequestFailed>& failure() const { return failure_; }
  std::string body() const;

 private:
  struct Choice {
    std::string text;
    std::vector<LogprobEntry> logprobs;
    std::string finish_reason;  // empty: none reported
  };
  nlohmann::ordered_json message(const Choice& choice, std::string& finish_reason) const;
  ResponseContext context_;
  std::vector<Choice> choices_;
  Usage usage_;
  bool finished_ = false;
  std::optional<RequestFailed> failure_;
};

// A streaming response: turns a request's events into server-sent events ("data: <json>\n\n").
class StreamEncoder {
 public:
  explicit StreamEncoder(ResponseContext context);
  // The events that open the stream: chat: a chunk per choice with role "assistant"; completions with echo: a
  // chunk per choice with the prompt.
  std::string begin();
  // Zero or more events. ChoiceFinished: the choice's last chunk, with finish_reason. RequestFinished: the usage
  // chunk (when asked for) and "data: [DONE]". RequestFailed: an error event and "data: [DONE]".
  // Throws std::out_of_range for a choice index the request does not have.
  std::string encode(const GenerationEvent& event);
  bool done() const { return done_; }

 private:
  // A chat choice's text held back while it may become a tool call (ResponseContext::tool_calls).
  struct HeldAnswer {
    bool holding = true;
    std::string text;
    std::vector<LogprobEntry> logprobs;
  };
  std::string delta_event(const ChoiceDelta& delta);
  std::string finish_event(const ChoiceFinished& finished);
  std::string release_held(int choice);

  ResponseContext context_;
  std::vector<size_t> text_offsets_;  // per choice: bytes of token text so far (completions' text_offset)
  std::vector<HeldAnswer> held_;      // per choice, when the answer may be tool calls
  bool done_ = false;
};

std::string sse_event(std::string_view data);  // "data: <data>\n\n"
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

}  // namespace strata
