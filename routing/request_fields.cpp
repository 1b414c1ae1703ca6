#include "routing/request_fields.h"

#include <algorithm>
#include <array>
#include <string>
#include <string_view>

#include "routing/api_error.h"

namespace strata {
namespace {

using json = nlohmann::ordered_json;

// Implemented in both dialects. Strata's extensions: top_k, min_p, ignore_eos, kv_compression. `user` names the end
// user for the operator's logs; it changes nothing in the output, as in the OpenAI API.
constexpr std::array kCommon = {"model", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options",
                                "logprobs", "stop", "presence_penalty", "frequency_penalty", "seed", "logit_bias",
                                "user", "top_k", "min_p", "ignore_eos", "min_tokens", "kv_compression",
                                "response_format"};
constexpr std::array kCompletionsOnly = {"prompt", "echo"};
constexpr std::array kChatOnly = {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
                                  "parallel_tool_calls"};

// Fields of the OpenAI API that Strata does not implement, with the value that asks for nothing where there is one.
struct UnimplementedField {
  std::string_view name;
  bool chat;          // in the chat dialect (otherwise completions)
  const char* why;    // what the 400 adds
};
constexpr std::array kUnimplemented = {
    UnimplementedField{"suffix", false, "insertion is not implemented"},
    UnimplementedField{"best_of", false, "only 1 is accepted ('n' asks for several choices)"},
    UnimplementedField{"functions", true, "the deprecated functions are not implemented: use 'tools'"},
    UnimplementedField{"function_call", true, "only 'none' is accepted (the deprecated form of 'tool_choice')"},
    UnimplementedField{"audio", true, "audio output is not implemented"},
    UnimplementedField{"modalities", true, "only [\"text\"] is accepted"},
    UnimplementedField{"prediction", true, "predicted outputs are not implemented"},
    UnimplementedField{"web_search_options", true, "web search is not implemented"},
    UnimplementedField{"reasoning_effort", true, "the model does not reason"},
    UnimplementedField{"verbosity", true, "it is not implemented"},
    UnimplementedField{"store", true, "only false is accepted (completions are not stored)"},
    UnimplementedField{"metadata", true, "completions are not stored"},
    UnimplementedField{"service_tier", true, "only 'auto' and 'default' are accepted"},
    UnimplementedField{"prompt_cache_key", true, "prefix caching is automatic"},
    UnimplementedField{"safety_identifier", true, "it is not implemented"},
};

// The value of an unimplemented field that asks for what Strata does anyway.
bool asks_for_nothing(std::string_view name, const json& value) {
  if (value.is_null()) return true;
  if (name == "best_of") return value == 1;
  if (name == "suffix") return value == "";
  if (name == "functions") return value.is_array() && value.empty();
  if (name == "function_call") return value == "none";
  if (name == "store") return value == false;
  if (name == "modalities") return value == json::array({"text"});
  if (name == "service_tier") return value == "auto" || value == "default";
  return false;
}

template <size_t N>
bool listed(const std::array<const char*, N>& names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

const UnimplementedField* unimplemented(std::string_view name, ApiDialect dialect) {
  for (const UnimplementedField& f : kUnimplemented) {
    if (f.name == name && f.chat == (dialect == ApiDialect::chat)) return &f;
  }
  return nullptr;
}

}  // namespace

void check_request_fields(const json& body, ApiDialect dialect, bool ignore_unknown_fields) {
  const bool chat = dialect == ApiDialect::chat;
  for (const auto& [name, value] : body.items()) {
    if (listed(kCommon, name) || (chat ? listed(kChatOnly, name) : listed(kCompletionsOnly, name))) continue;
    if (const UnimplementedField* f = unimplemented(name, dialect)) {
      if (asks_for_nothing(name, value)) continue;
      throw ApiError::invalid_request(name, "'" + name + "' is not supported by this server: " + f->why);
    }
    if (!ignore_unknown_fields) {
      throw ApiError::invalid_request(name, "Unrecognized request argument supplied: '" + name +
                                                "' (the server's operator may set server.ignore_unknown_fields)");
    }
  }
}

}  // namespace strata
