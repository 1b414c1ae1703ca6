#include "routing/http_messages.h"

#include <utility>

namespace strata {

Response make_response(unsigned version, bool keep_alive, http::status status, std::string body,
                       std::string_view content_type) {
  Response response{status, version};
  response.set(http::field::server, kServerName);
  response.set(http::field::content_type, content_type);
  response.keep_alive(keep_alive);
  response.body() = std::move(body);
  response.prepare_payload();
  return response;
}

Response error_response(unsigned version, bool keep_alive, const ApiError& error) {
  return make_response(version, keep_alive, http::status(error.http_status()), error.body(), "application/json");
}

}  // namespace strata
