#pragma once
// An error the HTTP API answers with: status, and the OpenAI error body
// {"error": {"message", "type", "param", "code"}} (param and code are null when empty).
#include <stdexcept>
#include <string>

#include "leader/generation.h"

namespace strata {

class ApiError : public std::runtime_error {
 public:
  ApiError(int http_status, std::string type, std::string message, std::string param = "", std::string code = "");

  // 400 invalid_request_error naming the offending field (param may be empty).
  static ApiError invalid_request(std::string param, std::string message);
  // 500 server_error: an exception the handler did not expect.
  static ApiError internal(std::string message);
  // What the engine's typed refusals and failures (leader/generation.h) mean over HTTP: the status, and a code a
  // client or load balancer can act on (retry here later, retry elsewhere, take this server out).
  static ApiError refused(const SubmitRefused& refused);
  static ApiError failed(const RequestFailed& failed);

  int http_status() const { return http_status_; }
  const std::string& type() const { return type_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }
  const char* message() const { return what(); }

  std::string body() const;  // the JSON error body, serialised

 private:
  int http_status_;
  std::string type_;
  std::string param_;
  std::string code_;
};

}  // namespace strata
