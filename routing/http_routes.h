#pragma once
// The server's routes: the route a request's path names, whether the request may use it (API keys), and the
// answers of every route but generation (models, tokenizer, health, metrics, /v1/kv_state). Generation is the
// session's (routing/http_session.cpp): it streams.
#include <optional>
#include <string>
#include <string_view>

#include "routing/api_error.h"
#include "routing/http_messages.h"

namespace strata {

struct ServerContext;

enum class Route { completions, chat_completions, models, model, tokenize, detokenize, health, metrics, kv_state };

struct RouteEntry {
  std::string_view path;
  http::verb method;
  Route route;
  bool prefix = false;  // the path continues with an argument (/v1/models/{model})
};

// The route of a path (a target without its query), whatever the method; nullptr when none has it.
const RouteEntry* find_route(std::string_view path);

// Why the request may not use the path, as the OpenAI API answers it, or none.
std::optional<ApiError> authorization_error(const ServerContext& server, const Request& request,
                                            std::string_view path);

// The answer of a route other than generation.
struct PlainAnswer {
  http::status status = http::status::ok;
  std::string body;
  std::string_view content_type = "application/json";
};

PlainAnswer plain_answer(ServerContext& server, const RouteEntry& route, std::string_view path,
                         std::string_view body);

}  // namespace strata
