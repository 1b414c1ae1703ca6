#include "router/upstream_connection.h"

namespace strata {
namespace {

constexpr size_t kPieceBytes = 16 << 10;

}  // namespace

UpstreamConnection::UpstreamConnection(net::any_io_executor executor, ReplicaEndpoint endpoint)
    : endpoint_(std::move(endpoint)), stream_(executor) {
  parser_.body_limit(boost::none);  // the client's limits were checked on the way in; the replica bounds its own
}

net::awaitable<beast::error_code> UpstreamConnection::send(Request request, std::chrono::milliseconds connect_timeout,
                                                           std::chrono::milliseconds timeout) {
  tcp::resolver resolver(stream_.get_executor());
  auto [resolve_ec, endpoints] =
      co_await resolver.async_resolve(endpoint_.host, std::to_string(endpoint_.port), use_nothrow);
  if (resolve_ec) co_return resolve_ec;
  stream_.expires_after(connect_timeout);
  auto [connect_ec, connected] = co_await stream_.async_connect(endpoints, use_nothrow);
  if (connect_ec) co_return connect_ec;
  beast::error_code ignored;
  stream_.socket().set_option(tcp::no_delay(true), ignored);
  const bool ipv6 = endpoint_.host.find(':') != std::string::npos;
  const std::string host = ipv6 ? "[" + endpoint_.host + "]" : endpoint_.host;
  request.set(http::field::host, host + ":" + std::to_string(endpoint_.port));
  request.keep_alive(false);
  request.prepare_payload();
  stream_.expires_after(timeout);
  auto [write_ec, n_written] = co_await http::async_write(stream_, request, use_nothrow);
  co_return write_ec;
}

net::awaitable<beast::error_code> UpstreamConnection::read_header(std::chrono::milliseconds timeout) {
  stream_.expires_after(timeout);
  auto [ec, n_read] = co_await http::async_read_header(stream_, buffer_, parser_, use_nothrow);
  co_return ec;
}

net::awaitable<beast::error_code> UpstreamConnection::read_body_piece(std::string& out,
                                                                     std::chrono::milliseconds timeout) {
  if (parser_.is_done()) co_return beast::error_code{};
  char piece[kPieceBytes];
  parser_.get().body().data = piece;
  parser_.get().body().size = sizeof piece;
  stream_.expires_after(timeout);
  auto [ec, n_read] = co_await http::async_read_some(stream_, buffer_, parser_, use_nothrow);
  if (ec == http::error::need_buffer) ec = {};  // the piece is full: the rest comes with the next call
  out.append(piece, sizeof piece - parser_.get().body().size);
  co_return ec;
}

net::awaitable<beast::error_code> UpstreamConnection::read_body(std::string& out, std::chrono::milliseconds timeout) {
  while (!parser_.is_done()) {
    if (beast::error_code ec = co_await read_body_piece(out, timeout)) co_return ec;
  }
  co_return beast::error_code{};
}

net::awaitable<FetchedResponse> fetch(net::any_io_executor executor, const ReplicaEndpoint& endpoint,
                                      std::string target, std::chrono::milliseconds timeout) {
  UpstreamConnection connection(executor, endpoint);
  FetchedResponse response;
  Request request{http::verb::get, target, 11};
  response.error = co_await connection.send(std::move(request), timeout, timeout);
  if (!response.error) response.error = co_await connection.read_header(timeout);
  if (response.error) co_return response;
  response.status = connection.header().result_int();
  response.error = co_await connection.read_body(response.body, timeout);
  co_return response;
}

}  // namespace strata
