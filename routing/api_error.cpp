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

std::string ApiError::body() const {
  auto or_null = [](const std::string& s) { return s.empty() ? nlohmann::json(nullptr) : nlohmann::json(s); };
  nlohmann::json error = {{"message", what()}, {"type", type_}, {"param", or_null(param_)}, {"code", or_null(code_)}};
  // Messages may quote user input, which need not be valid UTF-8.
  return nlohmann::json{{"error", std::move(error)}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace strata
