#pragma once
// One HTTP/1.1 exchange with a replica on a connection of its own: the request out, then the response's header,
// then its body piece by piece as the replica writes it (a stream's events as they come). Every step has a
// deadline. Beast stays in router/'s sources and routing/'s server (routing/http_messages.h).
#include <chrono>
#include <string>

#include "router/replica_endpoint.h"
#include "routing/http_messages.h"

namespace strata {

class UpstreamConnection {
 public:
  UpstreamConnection(net::any_io_executor executor, ReplicaEndpoint endpoint);

  // Resolves and connects within connect_timeout, then writes `request` (Host and Connection: close set here).
  net::awaitable<beast::error_code> send(Request request, std::chrono::milliseconds connect_timeout,
                                         std::chrono::milliseconds timeout);
  net::awaitable<beast::error_code> read_header(std::chrono::milliseconds timeout);
  const http::response_header<>& header() const { return parser_.get().base(); }
  bool body_done() const { return parser_.is_done(); }
  // Appends the next piece of the body to `out` (nothing once body_done()).
  net::awaitable<beast::error_code> read_body_piece(std::string& out, std::chrono::milliseconds timeout);
  // The rest of the body, appended to `out`.
  net::awaitable<beast::error_code> read_body(std::string& out, std::chrono::milliseconds timeout);

 private:
  ReplicaEndpoint endpoint_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  http::response_parser<http::buffer_body> parser_;
};

// A whole GET (health checks, metrics): the status (0 when there was no answer) and the body.
struct FetchedResponse {
  beast::error_code error;
  unsigned status = 0;
  std::string body;
};
net::awaitable<FetchedResponse> fetch(net::any_io_executor executor, const ReplicaEndpoint& endpoint,
                                      std::string target, std::chrono::milliseconds timeout);

}  // namespace strata
