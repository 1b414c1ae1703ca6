#include "routing/tokenizer_endpoints.h"

#include <array>
#include <span>
#include <vector>

#include "model/tokenizer.h"
#include "routing/api_error.h"
#include "routing/json_fields.h"

namespace strata {
namespace {

// Fields the endpoint reads; any other gets 400 naming it.
template <size_t N>
void check_fields(const RequestJson& root, const std::array<std::string_view, N>& known, std::string_view endpoint) {
  for (auto field = root.begin(); field != root.end(); ++field) {
    const std::string& name = field.key();
    bool found = false;
    for (std::string_view k : known) found = found || k == name;
    if (!found) throw ApiError::invalid_request(name, quoted(name) + " is not a field of " + std::string(endpoint));
  }
}

bool read_flag(const RequestJson& root, const char* name, bool otherwise) {
  const RequestJson* value = find_field(root, name);
  return value ? read_bool(*value, name) : otherwise;
}

// The body minus the tokenizer's own fields: a completions or chat request of one prompt, to parse as one.
RequestJson generation_request(const RequestJson& root, ApiDialect dialect) {
  RequestJson request = RequestJson::object();
  for (const char* name : {"model", "prompt", "messages", "tools"}) {
    if (root.contains(name)) request[name] = root[name];
  }
  if (dialect == ApiDialect::completions && root.contains("tools")) {
    throw ApiError::invalid_request("tools", "'tools' goes with 'messages'");
  }
  return request;
}

}  // namespace

std::string tokenize_response(std::string_view body, const Tokenizer& tokenizer, const ChatTemplate& chat_template,
                              const ProtocolLimits& limits) {
  const RequestJson root = parse_request_body(body);
  check_fields(root,
               std::array<std::string_view, 7>{"model", "prompt", "messages", "tools", "add_generation_prompt",
                                               "add_special_tokens", "return_token_strs"},
               "/tokenize");
  const bool chat = find_field(root, "messages") != nullptr;
  if (chat == (find_field(root, "prompt") != nullptr)) {
    throw ApiError::invalid_request("prompt", "give either 'prompt' or 'messages'");
  }
  const ApiDialect dialect = chat ? ApiDialect::chat : ApiDialect::completions;
  const std::vector<ParsedCompletion> parsed =
      parse_completion_request(generation_request(root, dialect).dump(), dialect, limits);
  if (parsed.size() != 1) throw ApiError::invalid_request("prompt", "/tokenize takes one prompt, not a batch");
  if (!chat && root.contains("add_generation_prompt")) {
    throw ApiError::invalid_request("add_generation_prompt", "'add_generation_prompt' goes with 'messages'");
  }
  const std::vector<int32_t> ids =
      prompt_token_ids(parsed.front(), tokenizer, chat_template, read_flag(root, "add_generation_prompt", true),
                       read_flag(root, "add_special_tokens", true));
  RequestJson response = {{"count", ids.size()}, {"max_model_len", limits.max_context}, {"tokens", ids},
                          {"token_strs", nullptr}};
  if (read_flag(root, "return_token_strs", false)) {
    RequestJson strs = RequestJson::array();
    for (int32_t id : ids) strs.push_back(tokenizer.token_bytes(id));
    response["token_strs"] = std::move(strs);
  }
  // A token's bytes may end mid-character: invalid UTF-8 becomes U+FFFD rather than an exception.
  return response.dump(-1, ' ', false, RequestJson::error_handler_t::replace);
}

std::string detokenize_response(std::string_view body, const Tokenizer& tokenizer, const ProtocolLimits& limits) {
  const RequestJson root = parse_request_body(body);
  check_fields(root, std::array<std::string_view, 2>{"model", "tokens"}, "/detokenize");
  requested_model(root, limits);
  const RequestJson* tokens = find_field(root, "tokens");
  if (!tokens) throw_required("tokens");
  const bool none = tokens->is_array() && tokens->empty();
  const std::vector<int32_t> ids = none ? std::vector<int32_t>() : read_token_ids(*tokens, "tokens", limits.vocab_size);
  const RequestJson response = {{"prompt", tokenizer.decode(std::span<const int32_t>(ids), /*skip_special=*/false)}};
  return response.dump(-1, ' ', false, RequestJson::error_handler_t::replace);
}

}  // namespace strata
