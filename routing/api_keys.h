#pragma once
// API keys: the bearer tokens a client must send (`Authorization: Bearer <key>`) on the routes that need one.
// The comparison takes the same time whichever byte differs and whichever key matches, so that a client cannot
// find a key byte by byte from response times. Keys are never logged, nor echoed in error messages.
#include <string>
#include <string_view>
#include <vector>

namespace strata {

class ApiKeys {
 public:
  ApiKeys() = default;  // no keys: every request is accepted
  explicit ApiKeys(std::vector<std::string> keys);

  bool empty() const { return keys_.empty(); }
  // Whether an Authorization header value ("Bearer <key>", the scheme in any case) carries a configured key.
  bool accepts(std::string_view authorization) const;

 private:
  std::vector<std::string> keys_;
};

// The keys of a key file's text: one per line, surrounding whitespace trimmed, blank lines and lines starting with
// '#' ignored.
std::vector<std::string> parse_api_key_lines(std::string_view text);

// Why a key cannot be used (empty, or holding whitespace or control characters, which an HTTP header cannot carry
// intact), or "" when it can. Never contains the key.
std::string api_key_problem(std::string_view key);

// Whether a server listening on `host` is reachable only from this machine (127.0.0.0/8, ::1, "localhost"): an
// open server (no keys) elsewhere deserves a warning.
bool is_loopback_host(const std::string& host);

}  // namespace strata
