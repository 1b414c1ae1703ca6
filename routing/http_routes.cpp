#include "routing/http_routes.h"

#include <stdexcept>

#include <nlohmann/json.hpp>

#include "routing/http_session.h"
#include "routing/openai_protocol.h"
#include "routing/tokenizer_endpoints.h"

namespace strata {
namespace {

constexpr RouteEntry kRoutes[] = {
    {"/v1/completions", http::verb::post, Route::completions},
    {"/v1/chat/completions", http::verb::post, Route::chat_completions},
    {"/v1/models", http::verb::get, Route::models},
    {"/v1/models/", http::verb::get, Route::model, true},
    {"/tokenize", http::verb::post, Route::tokenize},
    {"/detokenize", http::verb::post, Route::detokenize},
    {"/health", http::verb::get, Route::health},
    {"/metrics", http::verb::get, Route::metrics},
    {"/v1/kv_state", http::verb::get, Route::kv_state},
};

bool matches(const RouteEntry& route, std::string_view path) {
  if (!route.prefix) return path == route.path;
  return path.size() > route.path.size() && path.starts_with(route.path);
}

// A path segment with its %XX escapes decoded (a model id may hold '/', which clients send as is or as %2F); an
// escape that is not two hex digits stays as it is.
std::string percent_decoded(std::string_view text) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() && hex(text[i + 1]) >= 0 && hex(text[i + 2]) >= 0) {
      out += char(hex(text[i + 1]) * 16 + hex(text[i + 2]));
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

// The served model as /v1/models lists it.
nlohmann::json model_object(const ServerContext& server) {
  return {{"id", server.options.limits.model_name},
          {"object", "model"},
          {"created", server.started_at},
          {"owned_by", kServerName},
          {"max_model_len", server.options.limits.max_context}};
}

// Whether a path needs an API key (when keys are configured): the API under /v1 and the tokenizer's, and /metrics
// if so configured.
bool needs_key(const ServerOptions& options, std::string_view path) {
  return path == "/v1" || path.starts_with("/v1/") || path == "/tokenize" || path == "/detokenize" ||
         (options.metrics_require_key && path == "/metrics");
}

}  // namespace

const RouteEntry* find_route(std::string_view path) {
  for (const RouteEntry& route : kRoutes) {
    if (matches(route, path)) return &route;
  }
  return nullptr;
}

std::optional<ApiError> authorization_error(const ServerContext& server, const Request& request,
                                            std::string_view path) {
  if (server.keys.empty() || !needs_key(server.options, path)) return std::nullopt;
  auto header = request.find(http::field::authorization);
  if (header == request.end()) {
    return ApiError(401, "invalid_request_error",
                    "You didn't provide an API key. You need to provide your API key in an Authorization header "
                    "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
                    "", "invalid_api_key");
  }
  if (server.keys.accepts(header->value())) return std::nullopt;
  return ApiError(401, "invalid_request_error", "Incorrect API key provided.", "", "invalid_api_key");
}

PlainAnswer plain_answer(ServerContext& server, const RouteEntry& route, std::string_view path,
                         std::string_view body) {
  switch (route.route) {
    case Route::models:
      return {.body = nlohmann::json({{"object", "list"}, {"data", nlohmann::json::array({model_object(server)})}})
                          .dump()};
    case Route::model:
      check_model_name(percent_decoded(path.substr(route.path.size())), server.options.limits);
      return {.body = model_object(server).dump()};
    case Route::tokenize:
      return {.body = tokenize_response(body, server.tokenizer, server.chat_template, server.options.limits)};
    case Route::detokenize:
      return {.body = detokenize_response(body, server.tokenizer, server.options.limits)};
    case Route::health: {
      const bool healthy = server.service->healthy() && !server.draining;
      const nlohmann::json status = {{"status", server.draining ? "draining" : healthy ? "ok" : "unavailable"}};
      return {healthy ? http::status::ok : http::status::service_unavailable, status.dump()};
    }
    case Route::metrics:
      return {.body = server.service->metrics_text() + server.errors.text(), .content_type = "text/plain; version=0.0.4; charset=utf-8"};
    case Route::kv_state:
      return {.body = server.service->kv_state_json()};
    case Route::completions:
    case Route::chat_completions:
      break;
  }
  throw std::logic_error("generation is not a plain answer");
}

}  // namespace strata
