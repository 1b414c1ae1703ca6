#pragma once
// What answers the requests of a server that does not run an engine itself (strata route, router/): the session
// reads a request and checks its key, whether the server drains, its route and its method, then hands it to the
// RequestHandler with a ResponseWriter, the session's writes. An ApiError the handler throws is answered as the
// server answers its own: an error body, or an error event once a stream has begun.
#include <string_view>

#include "routing/http_messages.h"
#include "routing/http_routes.h"

namespace strata {

// The writes of one connection's session. Each returns false when the client is gone.
class ResponseWriter {
 public:
  virtual net::awaitable<bool> write(Response& response) = 0;
  // The status line and headers of a server-sent event stream; after it, an ApiError becomes an error event.
  virtual net::awaitable<bool> write_stream_header(const Request& request) = 0;
  virtual net::awaitable<bool> write_stream_data(std::string_view data) = 0;
  // Ends the stream; returns whether the connection may carry another request.
  virtual net::awaitable<bool> write_stream_end(const Request& request) = 0;

 protected:
  ~ResponseWriter() = default;
};

class RequestHandler {
 public:
  virtual ~RequestHandler() = default;
  // Answers a request on `route` (path: its target without the query); returns whether the connection may carry
  // another request. Runs on the connection's strand; requests of different connections run concurrently.
  virtual net::awaitable<bool> answer(Request& request, const RouteEntry& route, std::string_view path,
                                      ResponseWriter& writer) = 0;
};

}  // namespace strata
