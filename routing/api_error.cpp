#include "routing/api_error.h"

#include <nlohmann/json.hpp>

namespace strata {

ApiError::ApiError(int http_status, std::string type, std::string message, std::string param, std::string code)
    : std::runtime_error(std::move(message)),
      http_status_(http_status),
      type_(std::move(type)),
      param_(std::move(param)),
      code_(std::move(code)) {}

ApiError ApiError::invalid_request(std::string param, std::string message) {
  return ApiError(400, "invalid_request_error", std::move(message), std::move(param));
}

ApiError ApiError::internal(std::string message) {
  return ApiError(500, "server_error", std::move(message), "", "internal_error");
}

// 503 for every refusal: the server cannot take the request now, whatever the reason.
ApiError ApiError::refused(const SubmitRefused& refused) {
  switch (refused.why) {
    case Refusal::queue_full: return ApiError(503, "server_error", refused.what(), "", "overloaded");
    case Refusal::draining: return ApiError(503, "server_error", refused.what(), "", "draining");
    case Refusal::shutting_down: return ApiError(503, "server_error", refused.what(), "", "shutting_down");
    case Refusal::rank_lost: return ApiError(503, "server_error", refused.what(), "", "rank_lost");
  }
  return ApiError(503, "server_error", refused.what());
}

// A failed step or a lost rank is the server's fault (500); a stop, or a request that never started, may be retried
// elsewhere (503).
ApiError ApiError::failed(const RequestFailed& failed) {
  switch (failed.why) {
    case Failure::step_failed: return ApiError(500, "server_error", failed.message);
    case Failure::rank_lost: return ApiError(500, "server_error", failed.message, "", "rank_lost");
    case Failure::shutting_down: return ApiError(503, "server_error", failed.message, "", "shutting_down");
    case Failure::not_started: return ApiError(503, "server_error", failed.message, "", "not_started");
  }
  return ApiError(500, "server_error", failed.message);
}

std::string ApiError::body() const {
  auto or_null = [](const std::string& s) { return s.empty() ? nlohmann::json(nullptr) : nlohmann::json(s); };
  nlohmann::json error = {{"message", what()}, {"type", type_}, {"param", or_null(param_)}, {"code", or_null(code_)}};
  // Messages may quote user input, which need not be valid UTF-8.
  return nlohmann::json{{"error", std::move(error)}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace strata
