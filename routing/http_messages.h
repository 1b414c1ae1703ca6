#pragma once
// What every part of the HTTP server (routing/http_server.cpp: the listener; routing/http_session.cpp; the routes)
// writes with: Beast's names, and a whole response with the server's headers. Beast is included from here, so only
// the server's own files include this.
#include <string>
#include <string_view>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "routing/api_error.h"

namespace strata {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

// Asio's results as a tuple (error code first) instead of an exception.
constexpr auto use_nothrow = net::as_tuple(net::use_awaitable);
constexpr std::string_view kServerName = "strata";

using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;

Response make_response(unsigned version, bool keep_alive, http::status status, std::string body,
                       std::string_view content_type);
Response error_response(unsigned version, bool keep_alive, const ApiError& error);

}  // namespace strata
