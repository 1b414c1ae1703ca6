#include "routing/openai_protocol.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "cache/compression_policy.h"
#include "model/json_field.h"
#include "model/tokenizer.h"
#include "routing/api_error.h"
#include "routing/json_fields.h"
#include "routing/request_fields.h"

namespace strata {
namespace {

// Ordered: objects keep insertion order, so top_logprobs keeps the most likely token first (clients read the
// object in order) and responses list their fields as OpenAI does.
using json = RequestJson;

// ---------------------------------------------------------------------------------------------------------------
// Request parts

// What errors about prompt i of a request's n name: "prompt", or "prompt[i]" in a batch.
std::string prompt_param(size_t i, size_t n) { return n == 1 ? "prompt" : "prompt[" + std::to_string(i) + "]"; }

// prompt: "text" | [ids] | a batch of them, ["text", ...] or [[ids], ...] (each element either form), answered as
// one response whose choices are each prompt's in turn.
std::vector<PromptInput> parse_prompts(const json& root, const ProtocolLimits& limits) {
  const json* prompt = find_field(root, "prompt");
  if (!prompt) throw ApiError::invalid_request("prompt", "'prompt' is required");
  if (prompt->is_string()) return {prompt->get<std::string>()};
  if (!prompt->is_array()) throw_type("prompt", "a string or an array of token ids", *prompt);
  if (prompt->empty()) throw ApiError::invalid_request("prompt", "'prompt' must not be empty");
  if (!prompt->front().is_string() && !prompt->front().is_array()) {
    return {read_token_ids(*prompt, "prompt", limits.vocab_size)};  // one prompt of ids
  }
  if (prompt->size() > size_t(limits.max_prompts)) {
    throw ApiError::invalid_request("prompt", "a batch of " + std::to_string(prompt->size()) +
                                                  " prompts; this server answers at most " +
                                                  std::to_string(limits.max_prompts) + " in one request");
  }
  std::vector<PromptInput> prompts;
  for (size_t i = 0; i < prompt->size(); ++i) {
    const json& element = (*prompt)[i];
    const std::string param = prompt_param(i, prompt->size());
    if (element.is_string()) {
      prompts.emplace_back(element.get<std::string>());
    } else if (element.is_array()) {
      prompts.emplace_back(read_token_ids(element, param, limits.vocab_size));
    } else {
      throw_type(param, "a string or an array of token ids", element);
    }
  }
  return prompts;
}

std::string read_content(const json& message, const std::string& param, const std::string& role) {
  const json* content = find_field(message, "content");
  if (!content) {
    if (role == "assistant") return "";  // an assistant turn that only called tools
    throw ApiError::invalid_request(param, quoted(param) + " is required");
  }
  if (content->is_string()) return content->get<std::string>();
  if (!content->is_array()) throw_type(param, "a string or an array of content parts", *content);
  std::string text;
  for (size_t j = 0; j < content->size(); ++j) {
    const json& part = (*content)[j];
    std::string part_param = param + "[" + std::to_string(j) + "]";
    if (!part.is_object()) throw_type(part_param, "an object", part);
    const json* type = find_field(part, "type");
    if (!type) throw ApiError::invalid_request(part_param + ".type", quoted(part_param + ".type") + " is required");
    const std::string& type_name = read_string(*type, part_param + ".type");
    if (type_name != "text") {
      throw ApiError::invalid_request(part_param + ".type",
                                      "content part type '" + type_name + "' is not supported; only 'text' is");
    }
    const json* part_text = find_field(part, "text");
    if (!part_text) throw ApiError::invalid_request(part_param + ".text", quoted(part_param + ".text") + " is required");
    if (j > 0) text += '\n';  // as vLLM joins text parts
    text += read_string(*part_text, part_param + ".text");
  }
  return text;
}

// An assistant message's tool_calls: [{"id", "type": "function", "function": {"name", "arguments"}}].
std::vector<ToolCall> read_tool_calls(const json& message, const std::string& param) {
  std::vector<ToolCall> calls;
  const json* value = find_field(message, "tool_calls");
  if (!value) return calls;
  if (!value->is_array()) throw_type(param, "an array", *value);
  for (size_t j = 0; j < value->size(); ++j) {
    const json& call = (*value)[j];
    const std::string call_param = param + "[" + std::to_string(j) + "]";
    if (!call.is_object()) throw_type(call_param, "an object", call);
    const json* id = find_field(call, "id");
    if (!id) throw_required(call_param + ".id");
    const json* type = find_field(call, "type");
    if (type && read_string(*type, call_param + ".type") != "function") {
      throw ApiError::invalid_request(call_param + ".type", quoted(call_param + ".type") + " must be 'function'");
    }
    const json* function = find_field(call, "function");
    if (!function) throw_required(call_param + ".function");
    if (!function->is_object()) throw_type(call_param + ".function", "an object", *function);
    const json* name = find_field(*function, "name");
    if (!name) throw_required(call_param + ".function.name");
    const json* arguments = find_field(*function, "arguments");
    if (!arguments) throw_required(call_param + ".function.arguments");
    calls.push_back(ToolCall{read_string(*id, call_param + ".id"), read_string(*name, call_param + ".function.name"),
                             read_string(*arguments, call_param + ".function.arguments")});
  }
  return calls;
}

ChatMessage read_message(const json& message, const std::string& param) {
  if (!message.is_object()) throw_type(param, "an object", message);
  const json* role = find_field(message, "role");
  if (!role) throw_required(param + ".role");
  std::string role_name = read_string(*role, param + ".role");
  if (role_name == "developer") role_name = "system";  // OpenAI's newer name for the system role
  if (role_name != "system" && role_name != "user" && role_name != "assistant" && role_name != "tool") {
    throw ApiError::invalid_request(param + ".role", "role '" + role_name +
                                                         "' is not supported; use system, user, assistant or tool");
  }
  ChatMessage out{role_name, read_content(message, param + ".content", role_name)};
  if (role_name == "assistant") out.tool_calls = read_tool_calls(message, param + ".tool_calls");
  if (role_name == "tool") {
    const json* call_id = find_field(message, "tool_call_id");
    if (!call_id) throw_required(param + ".tool_call_id");
    out.tool_call_id = read_string(*call_id, param + ".tool_call_id");
    if (const json* name = find_field(message, "name")) out.name = read_string(*name, param + ".name");
  }
  return out;
}

std::vector<ChatMessage> parse_messages(const json& root) {
  const json* messages = find_field(root, "messages");
  if (!messages) throw ApiError::invalid_request("messages", "'messages' is required");
  if (!messages->is_array()) throw_type("messages", "an array", *messages);
  if (messages->empty()) throw ApiError::invalid_request("messages", "'messages' must not be empty");
  std::vector<ChatMessage> out;
  out.reserve(messages->size());
  for (size_t i = 0; i < messages->size(); ++i) out.push_back(read_message((*messages)[i], "messages[" + std::to_string(i) + "]"));
  return out;
}

void parse_max_tokens(const json& root, ApiDialect dialect, const ProtocolLimits& limits, ParsedCompletion& parsed) {
  // Chat: max_completion_tokens replaces the deprecated max_tokens; the newer one wins when both are set.
  const json* value = nullptr;
  parsed.max_tokens_param = "max_tokens";
  if (dialect == ApiDialect::chat && (value = find_field(root, "max_completion_tokens"))) {
    parsed.max_tokens_param = "max_completion_tokens";
  } else {
    value = find_field(root, "max_tokens");
  }
  if (!value) return;
  const std::string& param = parsed.max_tokens_param;
  int64_t max_tokens = read_integer(*value, param);
  if (max_tokens < 1) throw ApiError::invalid_request(param, quoted(param) + " must be at least 1, got " + value->dump());
  if (max_tokens > limits.max_context) {
    throw ApiError::invalid_request(param, quoted(param) + " is " + value->dump() + ", more than the model's context of " +
                                               std::to_string(limits.max_context) + " tokens");
  }
  parsed.request.sampling.max_tokens = int(max_tokens);
  parsed.max_tokens_given = true;
}

void parse_stop(const json& root, const ProtocolLimits& limits, SamplingParams& sampling) {
  const json* stop = find_field(root, "stop");
  if (!stop) return;
  auto add = [&](const json& value, const std::string& param) {
    const std::string& text = read_string(value, param);
    if (text.empty()) throw ApiError::invalid_request("stop", "stop strings must not be empty");
    sampling.stop.push_back(text);
  };
  if (stop->is_string()) return add(*stop, "stop");
  if (!stop->is_array()) throw_type("stop", "a string or an array of strings", *stop);
  if (int(stop->size()) > limits.max_stop) {
    throw ApiError::invalid_request("stop", "'stop' takes at most " + std::to_string(limits.max_stop) +
                                                " strings, got " + std::to_string(stop->size()));
  }
  for (const json& value : *stop) add(value, "stop");
}

// logit_bias: {"<token id>": bias in [-100, 100]}, added to the token's logit before sampling (as a penalty of
// -bias, kernels/token_sampling.h).
void parse_logit_bias(const json& root, const ProtocolLimits& limits, SamplingParams& sampling) {
  const json* biases = find_field(root, "logit_bias");
  if (!biases) return;
  if (!biases->is_object()) throw_type("logit_bias", "an object of token ids to biases", *biases);
  if (int(biases->size()) > limits.max_logit_bias) {
    throw ApiError::invalid_request("logit_bias", "'logit_bias' takes at most " + std::to_string(limits.max_logit_bias) +
                                                      " tokens, got " + std::to_string(biases->size()));
  }
  for (const auto& [key, value] : biases->items()) {
    int64_t id = -1;
    const auto [end, error] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (error != std::errc() || end != key.data() + key.size() || id < 0 || id >= limits.vocab_size) {
      throw ApiError::invalid_request("logit_bias", "'logit_bias' key '" + key + "' is not a token id in [0, " +
                                                        std::to_string(limits.vocab_size) + ")");
    }
    const std::string param = "logit_bias." + key;
    const double bias = read_number(value, param);
    check_range(bias, -100.0, 100.0, false, param, value);
    sampling.logit_bias.push_back({int32_t(id), -float(bias)});
  }
  std::sort(sampling.logit_bias.begin(), sampling.logit_bias.end(),
            [](const TokenPenalty& a, const TokenPenalty& b) { return a.id < b.id; });
  for (size_t i = 1; i < sampling.logit_bias.size(); ++i) {
    if (sampling.logit_bias[i].id == sampling.logit_bias[i - 1].id) {
      throw ApiError::invalid_request("logit_bias", "'logit_bias' names token " +
                                                        std::to_string(sampling.logit_bias[i].id) + " twice");
    }
  }
}

void parse_sampling(const json& root, const ProtocolLimits& limits, ParsedCompletion& parsed) {
  SamplingParams& sampling = parsed.request.sampling;
  if (const json* v = find_field(root, "temperature")) {
    sampling.temperature = float(read_number(*v, "temperature"));
    check_range(v->get<double>(), 0.0, 2.0, false, "temperature", *v);
  }
  if (const json* v = find_field(root, "top_p")) {
    sampling.top_p = float(read_number(*v, "top_p"));
    check_range(v->get<double>(), 0.0, 1.0, true, "top_p", *v);
  }
  if (const json* v = find_field(root, "top_k")) {
    int64_t top_k = read_integer(*v, "top_k");
    if (top_k < -1) throw ApiError::invalid_request("top_k", "'top_k' must be -1, 0 (off) or positive, got " + v->dump());
    sampling.top_k = top_k <= 0 ? 0 : int(std::min<int64_t>(top_k, std::numeric_limits<int>::max()));
  }
  if (const json* v = find_field(root, "min_p")) {
    sampling.min_p = float(read_number(*v, "min_p"));
    check_range(v->get<double>(), 0.0, 1.0, false, "min_p", *v);
  }
  if (const json* v = find_field(root, "presence_penalty")) {
    sampling.presence_penalty = float(read_number(*v, "presence_penalty"));
    check_range(v->get<double>(), -2.0, 2.0, false, "presence_penalty", *v);
  }
  if (const json* v = find_field(root, "frequency_penalty")) {
    sampling.frequency_penalty = float(read_number(*v, "frequency_penalty"));
    check_range(v->get<double>(), -2.0, 2.0, false, "frequency_penalty", *v);
  }
  if (const json* v = find_field(root, "seed")) {
    if (!v->is_number_integer()) throw_type("seed", "an integer", *v);
    // Any 64-bit integer, negative ones as their two's complement.
    sampling.seed = v->is_number_unsigned() ? v->get<uint64_t>() : uint64_t(v->get<int64_t>());
  }
  if (const json* v = find_field(root, "ignore_eos")) sampling.ignore_eos = read_bool(*v, "ignore_eos");
  if (const json* v = find_field(root, "min_tokens")) {
    const int64_t min_tokens = read_integer(*v, "min_tokens");
    check_integer_range(min_tokens, 0, limits.max_context, "min_tokens", *v);
    sampling.min_tokens = int(min_tokens);
  }
  if (const json* v = find_field(root, "n")) {
    int64_t n = read_integer(*v, "n");
    check_integer_range(n, 1, limits.max_n, "n", *v);
    parsed.request.n = int(n);
  }
  parse_stop(root, limits, sampling);
  parse_logit_bias(root, limits, sampling);
}

// completions: logprobs is an integer 0..20 (top alternatives per token); chat: logprobs is a boolean and
// top_logprobs an integer 0..20.
void parse_logprobs(const json& root, ApiDialect dialect, const ProtocolLimits& limits, ParsedCompletion& parsed) {
  int& n_logprobs = parsed.request.sampling.n_logprobs;
  if (dialect == ApiDialect::completions) {
    if (const json* v = find_field(root, "logprobs")) {
      int64_t k = read_integer(*v, "logprobs");
      check_integer_range(k, 0, limits.max_top_logprobs, "logprobs", *v);
      n_logprobs = int(k);
    }
  } else {
    bool wanted = false;
    if (const json* v = find_field(root, "logprobs")) wanted = read_bool(*v, "logprobs");
    int64_t top = 0;
    if (const json* v = find_field(root, "top_logprobs")) {
      top = read_integer(*v, "top_logprobs");
      check_integer_range(top, 0, limits.max_top_logprobs, "top_logprobs", *v);
      if (top > 0 && !wanted) {
        throw ApiError::invalid_request("top_logprobs", "'top_logprobs' needs 'logprobs' set to true");
      }
    }
    if (wanted) n_logprobs = int(top);
  }
  parsed.logprobs = n_logprobs >= 0;
}

void parse_stream(const json& root, ParsedCompletion& parsed) {
  if (const json* v = find_field(root, "stream")) parsed.stream = read_bool(*v, "stream");
  const json* options = find_field(root, "stream_options");
  if (!options) return;
  if (!parsed.stream) {
    throw ApiError::invalid_request("stream_options", "'stream_options' is only allowed when 'stream' is true");
  }
  if (!options->is_object()) throw_type("stream_options", "an object", *options);
  if (const json* v = find_field(*options, "include_usage")) {
    parsed.include_usage = read_bool(*v, "stream_options.include_usage");
  }
}

// The engine queues at most max_sequences choices: a request for more could never start, so it is a 400 and not
// the 503 of a queue that is full for now.
void check_sequences(size_t prompts, int n, const ProtocolLimits& limits) {
  if (int64_t(prompts) * n <= limits.max_sequences) return;
  const std::string asked = prompts == 1 ? std::to_string(n) + " choices"
                                         : std::to_string(n) + " choices for each of " + std::to_string(prompts) +
                                               " prompts";
  throw ApiError::invalid_request(prompts == 1 ? "n" : "prompt",
                                  asked + " ask for more sequences than this server queues at once (" +
                                      std::to_string(limits.max_sequences) + ")");
}

void parse_echo(const json& root, ParsedCompletion& parsed) {
  const json* v = find_field(root, "echo");
  if (!v) return;
  parsed.echo = read_bool(*v, "echo");
  if (parsed.echo && parsed.logprobs) {
    throw ApiError::invalid_request("echo", "'echo' with 'logprobs' is not supported (prompt logprobs are not computed)");
  }
}

// Strata's extension: "kv_compression": {"policy": "pyramidkv", "budget": 128, ...} picks the request's KV
// compression policy and its parameters, among the policies the operator enabled (kv_cache.request_policies).
void parse_kv_compression(const json& root, ParsedCompletion& parsed, const ProtocolLimits& limits) {
  const json* kv = find_field(root, "kv_compression");
  if (!kv) return;
  if (!kv->is_object()) throw_type("kv_compression", "an object", *kv);
  const json* policy = find_field(*kv, "policy");
  if (!policy) throw ApiError::invalid_request("kv_compression.policy", "'kv_compression.policy' is required");
  PolicySpec spec;
  spec.name = read_string(*policy, "kv_compression.policy");
  if (std::find(limits.kv_policies.begin(), limits.kv_policies.end(), spec.name) == limits.kv_policies.end()) {
    std::string enabled;
    for (const std::string& p : limits.kv_policies) enabled += (enabled.empty() ? "" : ", ") + p;
    throw ApiError::invalid_request("kv_compression.policy", "KV compression policy '" + spec.name +
                                                                 "' is not enabled on this server (enabled: " +
                                                                 enabled + ")");
  }
  for (const auto& [key, value] : kv->items()) {
    if (key == "policy") continue;
    const std::string param = "kv_compression." + key;
    if (value.is_string()) {
      spec.params[key] = value.get<std::string>();
    } else if (value.is_boolean()) {
      spec.params[key] = value.get<bool>() ? "true" : "false";
    } else if (value.is_number_integer()) {
      spec.params[key] = std::to_string(value.get<int64_t>());
    } else if (value.is_number()) {
      spec.params[key] = value.dump();
    } else {
      throw_type(param, "a number, a string or a boolean", value);
    }
  }
  try {
    validate_policy(spec);
  } catch (const PolicyError& e) {
    const bool about_name = e.param().empty() || e.param() == "policy";
    throw ApiError::invalid_request(about_name ? "kv_compression.policy" : "kv_compression." + e.param(), e.what());
  }
  if (limits.check_kv_policy) {
    try {
      limits.check_kv_policy(spec);
    } catch (const std::invalid_argument& e) {
      throw ApiError::invalid_request("kv_compression.policy", std::string("this server cannot run it: ") + e.what());
    }
  }
  parsed.request.kv_policy = std::move(spec);
}

// ---------------------------------------------------------------------------------------------------------------
// Responses

// The shortest decimal that reads back as the same float, so 0.1f prints as 0.1, not 0.10000000149011612.
// Probabilities of zero give -inf, which JSON cannot hold: clamped like vLLM does.
json logprob_json(float logprob) {
  if (!std::isfinite(logprob) || logprob < -9999.0f) return -9999.0;
  char text[32];
  auto end = std::to_chars(text, text + sizeof text, logprob).ptr;
  *end = '\0';
  return std::strtod(text, nullptr);
}

json bytes_json(const std::string& token) {
  json bytes = json::array();
  for (unsigned char c : token) bytes.push_back(int(c));
  return bytes;
}

// Completions: {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}; text_offset counts
// bytes of token text from the start of the choice's text (after any echo).
json completion_logprobs_json(const std::vector<LogprobEntry>& entries, size_t& text_offset) {
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
       offsets = json::array();
  for (const LogprobEntry& entry : entries) {
    tokens.push_back(entry.token);
    token_logprobs.push_back(logprob_json(entry.logprob));
    json top = json::object();
    for (const auto& [token, logprob] : entry.top) top[token] = logprob_json(logprob);
    top_logprobs.push_back(std::move(top));
    offsets.push_back(text_offset);
    text_offset += entry.token.size();
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top_logprobs)},
          {"text_offset", std::move(offsets)}};
}

// Chat: {content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}.
json chat_logprobs_json(const std::vector<LogprobEntry>& entries) {
  json content = json::array();
  for (const LogprobEntry& entry : entries) {
    json top = json::array();
    for (const auto& [token, logprob] : entry.top) {
      top.push_back({{"token", token}, {"logprob", logprob_json(logprob)}, {"bytes", bytes_json(token)}});
    }
    content.push_back({{"token", entry.token},
                       {"logprob", logprob_json(entry.logprob)},
                       {"bytes", bytes_json(entry.token)},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}};
}

json usage_json(const Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", usage.cached_prompt_tokens}}}};
}

json finish_reason_json(const std::string& reason) { return reason.empty() ? json(nullptr) : json(reason); }

// The protocol's finish_reason of a choice the engine ended; "tool_calls" replaces "stop" later where the answer
// is tool calls. An aborted choice has no client to read it.
std::string openai_finish_reason(FinishReason reason) { return std::string(finish_reason_name(reason)); }

json response_head(const ResponseContext& context, const char* object) {
  return {{"id", context.id}, {"object", object}, {"created", context.created}, {"model", context.model}};
}

const char* chunk_object(const ResponseContext& context) {
  return context.dialect == ApiDialect::chat ? "chat.completion.chunk" : "text_completion";
}

// Token text is raw bytes that may end mid-character; invalid UTF-8 becomes U+FFFD instead of an exception.
std::string dump(const json& value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }

// One streamed chunk holding one choice. With include_usage every chunk carries "usage": null, as OpenAI's do.
std::string chunk_event(const ResponseContext& context, json choice) {
  json chunk = response_head(context, chunk_object(context));
  chunk["choices"] = json::array({std::move(choice)});
  if (context.include_usage) chunk["usage"] = nullptr;
  return sse_event(dump(chunk));
}

void check_choice(int choice, size_t n) {
  if (choice < 0 || size_t(choice) >= n) {
    throw std::out_of_range("event for choice " + std::to_string(choice) + " of a request with " + std::to_string(n));
  }
}

}  // namespace

// -----------------------------------------------------------------------------------------------------------------

void check_model_name(const std::string& name, const ProtocolLimits& limits) {
  if (name != limits.model_name) {
    throw ApiError(404, "invalid_request_error",
                   "The model '" + name + "' does not exist; this server serves '" + limits.model_name + "'",
                   "model", "model_not_found");
  }
}

const std::string& requested_model(const RequestJson& root, const ProtocolLimits& limits) {
  const json* model = find_field(root, "model");
  if (!model) return limits.model_name;  // like vLLM: the one served model
  check_model_name(read_string(*model, "model"), limits);
  return limits.model_name;
}

std::vector<ParsedCompletion> parse_completion_request(std::string_view body, ApiDialect dialect,
                                                       const ProtocolLimits& limits) {
  const json root = parse_request_body(body);
  check_request_fields(root, dialect, limits.ignore_unknown_fields);

  ParsedCompletion parsed;
  parsed.dialect = dialect;
  parsed.model = requested_model(root, limits);
  std::vector<PromptInput> prompts;
  if (dialect == ApiDialect::chat) {
    prompts.push_back(parse_messages(root));
  } else {
    prompts = parse_prompts(root, limits);
  }
  parse_max_tokens(root, dialect, limits, parsed);
  parse_sampling(root, limits, parsed);
  check_sequences(prompts.size(), parsed.request.n, limits);
  parse_logprobs(root, dialect, limits, parsed);
  if (dialect == ApiDialect::completions) parse_echo(root, parsed);
  parse_stream(root, parsed);
  parse_kv_compression(root, parsed, limits);
  parsed.output_format = parse_output_format(root, dialect);
  std::vector<ParsedCompletion> batch(prompts.size(), parsed);
  for (size_t i = 0; i < prompts.size(); ++i) {
    batch[i].prompt = std::move(prompts[i]);
    batch[i].prompt_param = dialect == ApiDialect::chat ? "messages" : prompt_param(i, prompts.size());
  }
  return batch;
}

std::vector<int32_t> prompt_token_ids(const ParsedCompletion& parsed, const Tokenizer& tokenizer,
                                      const ChatTemplate& chat_template, bool add_generation_prompt, bool add_special) {
  std::vector<int32_t> ids;
  if (auto* messages = std::get_if<std::vector<ChatMessage>>(&parsed.prompt)) {
    std::string text;
    try {
      text = chat_template.render(*messages, parsed.output_format.prompt_tools(), add_generation_prompt);
    } catch (const FieldError& e) {  // "messages[2].tool_calls[0].function.arguments: not valid JSON"
      throw ApiError::invalid_request(e.field(), e.what());
    }
    ids = tokenizer.encode(text, /*parse_special=*/true);
  } else if (auto* text = std::get_if<std::string>(&parsed.prompt)) {
    ids = tokenizer.encode(*text, /*parse_special=*/false);  // user text never becomes control tokens
  } else {
    return std::get<std::vector<int32_t>>(parsed.prompt);  // the client chose every id, BOS included or not
  }
  std::optional<int32_t> bos = tokenizer.bos_id();
  if (add_special && tokenizer.add_bos() && bos && (ids.empty() || ids.front() != *bos)) ids.insert(ids.begin(), *bos);
  return ids;
}

void encode_prompt(ParsedCompletion& parsed, const Tokenizer& tokenizer, const ChatTemplate& chat_template,
                   const ProtocolLimits& limits) {
  std::vector<int32_t>& ids = parsed.request.prompt_ids;
  const std::string& param = parsed.prompt_param;
  ids = prompt_token_ids(parsed, tokenizer, chat_template);
  if (parsed.echo) {
    if (auto* text = std::get_if<std::string>(&parsed.prompt)) {
      parsed.echo_text = *text;
    } else if (std::holds_alternative<std::vector<int32_t>>(parsed.prompt)) {
      parsed.echo_text = tokenizer.decode(ids, /*skip_special=*/false);
    }
  }
  parsed.request.grammar = output_grammar(parsed.output_format, chat_template.tool_call_syntax());

  if (ids.empty()) throw ApiError::invalid_request(param, "the " + param + " is empty");
  int prompt_tokens = int(ids.size());
  if (prompt_tokens >= limits.max_context) {
    throw ApiError::invalid_request(param, "the " + (param == "messages" ? "prompt" : param) + " is " +
                                               std::to_string(prompt_tokens) +
                                               " tokens, but the model's context is " +
                                               std::to_string(limits.max_context) +
                                               " tokens and must leave room for at least one generated token");
  }
  int room = limits.max_context - prompt_tokens;
  int& max_tokens = parsed.request.sampling.max_tokens;
  if (!parsed.max_tokens_given) {
    max_tokens = parsed.dialect == ApiDialect::chat ? room : std::min(16, room);  // OpenAI's defaults
  } else if (max_tokens > room) {
    throw ApiError::invalid_request(
        parsed.max_tokens_param,
        "the model's context is " + std::to_string(limits.max_context) + " tokens, but " +
            std::to_string(prompt_tokens + max_tokens) + " were requested (" + std::to_string(prompt_tokens) +
            " in the prompt, " + std::to_string(max_tokens) + " for the completion)");
  }
  const int min_tokens = parsed.request.sampling.min_tokens;
  if (min_tokens > max_tokens) {
    throw ApiError::invalid_request("min_tokens", "'min_tokens' is " + std::to_string(min_tokens) +
                                                      ", more than the completion's " + std::to_string(max_tokens) +
                                                      " tokens at most");
  }
  if (min_tokens > 0 && parsed.request.grammar) {
    throw ApiError::invalid_request("min_tokens", "'min_tokens' cannot go with a response_format or a forced tool "
                                                  "call: the grammar decides where the output ends");
  }
}

std::string make_request_id(ApiDialect dialect) {
  // A random per-process prefix and a counter: unique without a lock.
  static const uint64_t process_bits = std::random_device{}() * 0x9E3779B97F4A7C15ull ^ std::random_device{}();
  static std::atomic<uint64_t> counter{0};
  char hex[25];
  std::snprintf(hex, sizeof hex, "%016llx%08llx", static_cast<unsigned long long>(process_bits),
                static_cast<unsigned long long>(counter.fetch_add(1) & 0xffffffffull));
  return (dialect == ApiDialect::chat ? "chatcmpl-" : "cmpl-") + std::string(hex);
}

ResponseContext make_response_context(const std::vector<ParsedCompletion>& batch, const ChatTemplate& chat_template,
                                      int64_t created) {
  const ParsedCompletion& parsed = batch.front();
  ResponseContext context;
  context.dialect = parsed.dialect;
  context.id = parsed.request.id;
  context.model = parsed.model;
  context.created = created;
  context.n = parsed.request.n * int(batch.size());
  context.n_per_prompt = parsed.request.n;
  context.logprobs = parsed.logprobs;
  context.include_usage = parsed.include_usage;
  if (parsed.echo) {
    for (const ParsedCompletion& prompt : batch) context.echo_texts.push_back(prompt.echo_text);
  }
  if (parsed.output_format.answers_with_tools()) {
    std::vector<std::string> names;
    for (const ToolDefinition& tool : parsed.output_format.prompt_tools()) names.push_back(tool.name);
    context.tool_calls.emplace(chat_template, std::move(names));
  }
  return context;
}

const std::string& echo_text(const ResponseContext& context, int choice) {
  static const std::string none;
  return context.echo_texts.empty() ? none : context.echo_texts.at(size_t(choice / context.n_per_prompt));
}

std::string sse_event(std::string_view data) {
  std::string event;
  event.reserve(data.size() + 8);
  event.append("data: ").append(data).append("\n\n");
  return event;
}

// -----------------------------------------------------------------------------------------------------------------
// CompletionCollector

CompletionCollector::CompletionCollector(ResponseContext context)
    : context_(std::move(context)), choices_(size_t(context_.n)) {}

void CompletionCollector::add(const GenerationEvent& event) {
  if (auto* delta = std::get_if<ChoiceDelta>(&event)) {
    check_choice(delta->choice, choices_.size());
    Choice& choice = choices_[size_t(delta->choice)];
    choice.text += delta->text;
    choice.logprobs.insert(choice.logprobs.end(), delta->logprobs.begin(), delta->logprobs.end());
  } else if (auto* finished = std::get_if<ChoiceFinished>(&event)) {
    check_choice(finished->choice, choices_.size());
    choices_[size_t(finished->choice)].finish_reason = openai_finish_reason(finished->reason);
  } else if (auto* request_finished = std::get_if<RequestFinished>(&event)) {
    usage_ = request_finished->usage;
    finished_ = true;
  } else {
    failure_ = std::get<RequestFailed>(event);
  }
}

std::string CompletionCollector::body() const {
  bool chat = context_.dialect == ApiDialect::chat;
  json response = response_head(context_, chat ? "chat.completion" : "text_completion");
  json choices = json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& choice = choices_[i];
    json logprobs = nullptr;
    json out = {{"index", i}};
    std::string finish_reason = choice.finish_reason;
    if (chat) {
      if (context_.logprobs) logprobs = chat_logprobs_json(choice.logprobs);
      out["message"] = message(choice, finish_reason);
    } else {
      const std::string& echo = echo_text(context_, int(i));
      size_t text_offset = echo.size();
      if (context_.logprobs) logprobs = completion_logprobs_json(choice.logprobs, text_offset);
      out["text"] = echo + choice.text;
    }
    out["logprobs"] = std::move(logprobs);
    out["finish_reason"] = finish_reason_json(finish_reason);
    choices.push_back(std::move(out));
  }
  response["choices"] = std::move(choices);
  response["usage"] = usage_json(usage_);
  return dump(response);
}

// A chat choice's message: its text, or the tool calls it is (finish_reason then becomes "tool_calls"). An answer
// cut short by the length limit is left as text.
json CompletionCollector::message(const Choice& choice, std::string& finish_reason) const {
  if (context_.tool_calls && finish_reason == "stop") {
    if (auto calls = context_.tool_calls->read(choice.text)) {
      finish_reason = "tool_calls";
      return {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", tool_calls_json(*calls, false)}};
    }
  }
  return {{"role", "assistant"}, {"content", choice.text}};
}

// -----------------------------------------------------------------------------------------------------------------
// StreamEncoder

StreamEncoder::StreamEncoder(ResponseContext context)
    : context_(std::move(context)),
      text_offsets_(size_t(context_.n)),
      held_(context_.tool_calls ? size_t(context_.n) : 0) {
  for (int i = 0; i < context_.n; ++i) text_offsets_[size_t(i)] = echo_text(context_, i).size();
}

std::string StreamEncoder::begin() {
  std::string events;
  for (int i = 0; i < context_.n; ++i) {
    if (context_.dialect == ApiDialect::chat) {
      events += chunk_event(context_, {{"index", i},
                                       {"delta", {{"role", "assistant"}, {"content", ""}}},
                                       {"logprobs", nullptr},
                                       {"finish_reason", nullptr}});
    } else if (const std::string& echo = echo_text(context_, i); !echo.empty()) {
      events +=
          chunk_event(context_, {{"index", i}, {"text", echo}, {"logprobs", nullptr}, {"finish_reason", nullptr}});
    }
  }
  return events;
}

std::string StreamEncoder::encode(const GenerationEvent& event) {
  if (auto* delta = std::get_if<ChoiceDelta>(&event)) {
    check_choice(delta->choice, text_offsets_.size());
    if (context_.tool_calls) {
      HeldAnswer& held = held_[size_t(delta->choice)];
      if (held.holding) {
        held.text += delta->text;
        held.logprobs.insert(held.logprobs.end(), delta->logprobs.begin(), delta->logprobs.end());
        return context_.tool_calls->may_become_call(held.text) ? "" : release_held(delta->choice);
      }
    }
    return delta_event(*delta);
  }
  if (auto* finished = std::get_if<ChoiceFinished>(&event)) {
    check_choice(finished->choice, text_offsets_.size());
    return finish_event(*finished);
  }
  done_ = true;
  if (auto* request_finished = std::get_if<RequestFinished>(&event)) {
    std::string events;
    if (context_.include_usage) {
      json chunk = response_head(context_, chunk_object(context_));
      chunk["choices"] = json::array();
      chunk["usage"] = usage_json(request_finished->usage);
      events = sse_event(dump(chunk));
    }
    return events.append(kSseDone);
  }
  const RequestFailed& failed = std::get<RequestFailed>(event);
  return sse_event(ApiError::failed(failed).body()).append(kSseDone);
}

std::string StreamEncoder::delta_event(const ChoiceDelta& delta) {
  const bool with_logprobs = context_.logprobs && !delta.logprobs.empty();
  if (delta.text.empty() && !with_logprobs) return "";  // e.g. a token held back mid-character
  json choice = {{"index", delta.choice}};
  json logprobs = nullptr;
  if (context_.dialect == ApiDialect::chat) {
    choice["delta"] = {{"content", delta.text}};
    if (with_logprobs) logprobs = chat_logprobs_json(delta.logprobs);
  } else {
    choice["text"] = delta.text;
    if (with_logprobs) logprobs = completion_logprobs_json(delta.logprobs, text_offsets_[size_t(delta.choice)]);
  }
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = nullptr;
  return chunk_event(context_, std::move(choice));
}

// The held text turned out not to be a call: it goes out as content, and the choice streams from here on.
std::string StreamEncoder::release_held(int choice) {
  HeldAnswer& held = held_[size_t(choice)];
  held.holding = false;
  ChoiceDelta delta{choice, std::move(held.text), {}, std::move(held.logprobs)};
  return delta_event(delta);
}

// A choice's last chunk; an answer held back whole that is tool calls goes out as one delta.tool_calls first.
std::string StreamEncoder::finish_event(const ChoiceFinished& finished) {
  std::string events;
  std::string reason = openai_finish_reason(finished.reason);
  if (context_.tool_calls && held_[size_t(finished.choice)].holding) {
    HeldAnswer& held = held_[size_t(finished.choice)];
    std::optional<std::vector<ParsedToolCall>> calls;
    if (reason == "stop") calls = context_.tool_calls->read(held.text);
    if (calls) {
      held.holding = false;
      reason = "tool_calls";
      json logprobs = context_.logprobs ? chat_logprobs_json(held.logprobs) : json(nullptr);
      events += chunk_event(context_, {{"index", finished.choice},
                                       {"delta", {{"tool_calls", tool_calls_json(*calls, true)}}},
                                       {"logprobs", std::move(logprobs)},
                                       {"finish_reason", nullptr}});
    } else {
      events += release_held(finished.choice);
    }
  }
  json choice = {{"index", finished.choice}};
  if (context_.dialect == ApiDialect::chat) {
    choice["delta"] = json::object();
  } else {
    choice["text"] = "";
  }
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = finish_reason_json(reason);
  return events + chunk_event(context_, std::move(choice));
}

}  // namespace strata
