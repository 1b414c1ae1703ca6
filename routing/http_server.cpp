#include "routing/http_server.h"

#include <chrono>
#include <cstdio>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <vector>

#include "routing/accept_backoff.h"
#include "routing/api_error.h"
#include "routing/connection_limit.h"
#include "routing/http_messages.h"
#include "routing/http_session.h"

// The listener: it accepts connections and gives each a session, or past server.max_connections a 503; and the I/O
// threads that run them.
namespace strata {
namespace {

// Retry-After of the 503 a connection over the limit gets.
constexpr std::string_view kBusyRetryAfterS = "1";
// How long a refused connection may stay for its answer to be read: short, since refusals in flight are bounded
// and the connections behind them wait in the backlog.
constexpr std::chrono::milliseconds kRefusalLinger{250};
// How often a listener with every connection and refusal slot taken looks again.
constexpr std::chrono::milliseconds kFullPoll{10};

// A connection over server.max_connections: a 503 without reading the request, then a short linger so that the
// close does not reset the connection before the client has read the answer.
net::awaitable<void> refuse_connection(ServerContext& server, tcp::socket socket,
                                       [[maybe_unused]] ConnectionLimit::Slot slot) {
  beast::tcp_stream stream(std::move(socket));
  ApiError error(503, "server_error",
                 "the server holds its maximum of " + std::to_string(server.options.max_connections) +
                     " connections; retry later",
                 "", "too_many_connections");
  server.errors.record(503);
  Response response = error_response(11, false, error);
  response.set(http::field::retry_after, kBusyRetryAfterS);
  stream.expires_after(kRefusalLinger);
  auto [ec, n_written] = co_await http::async_write(stream, response, use_nothrow);
  if (ec) co_return;
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
  char scratch[4096];
  for (;;) {
    auto [read_ec, n_read] = co_await stream.async_read_some(net::buffer(scratch), use_nothrow);
    if (read_ec) co_return;
  }
}

void log_accept(const std::string& line) {
  if (!line.empty()) std::fprintf(stderr, "strata http: %s\n", line.c_str());
}

net::awaitable<void> listen(tcp::acceptor& acceptor, ServerContext& server) {
  AcceptBackoff backoff;
  for (;;) {
    // With no slot to serve or refuse a connection, it waits in the backlog rather than being reset.
    while (server.connections.n_open() >= server.connections.max_open() &&
           server.refusals.n_open() >= server.refusals.max_open()) {
      net::steady_timer pause(acceptor.get_executor(), kFullPoll);
      if (auto [ec] = co_await pause.async_wait(use_nothrow); ec) co_return;
    }
    // Each connection gets its own strand: its coroutine and its sinks' wake-ups never run concurrently.
    auto [ec, socket] = co_await acceptor.async_accept(net::make_strand(acceptor.get_executor()), use_nothrow);
    if (ec == net::error::operation_aborted) co_return;
    if (ec) {  // e.g. out of file descriptors: keep serving the open connections, retry after a growing pause
      AcceptBackoff::Decision decision = backoff.on_failure(ec.message(), AcceptBackoff::Clock::now());
      log_accept(decision.log);
      net::steady_timer pause(acceptor.get_executor(), decision.delay);
      co_await pause.async_wait(use_nothrow);
      continue;
    }
    log_accept(backoff.on_success());
    auto executor = socket.get_executor();
    if (std::optional<ConnectionLimit::Slot> slot = server.connections.try_take()) {
      net::co_spawn(executor, serve_connection(server, std::move(socket), std::move(*slot)), net::detached);
    } else if (std::optional<ConnectionLimit::Slot> refusal = server.refusals.try_take()) {
      net::co_spawn(executor, refuse_connection(server, std::move(socket), std::move(*refusal)), net::detached);
    }  // else: a slot was taken since the wait above (only this loop takes slots, so never): the socket closes
  }
}

}  // namespace

struct HttpServer::Impl {
  Impl(ServerOptions options, GenerationService* service, RequestHandler* handler, const Tokenizer& tokenizer,
       const ChatTemplate& chat_template)
      : server(std::move(options), service, handler, tokenizer, chat_template) {}

  ServerContext server;  // declared before the io_context: outlives the sessions' coroutine frames
  std::unique_ptr<net::io_context> io_context;
  std::optional<tcp::acceptor> acceptor;
  std::vector<std::thread> threads;
  uint16_t bound_port = 0;
  std::mutex state_mutex;  // start() / stop()
  bool started = false;
};

HttpServer::HttpServer(ServerOptions options, GenerationService& service, const Tokenizer& tokenizer,
                       const ChatTemplate& chat_template)
    : impl_(std::make_unique<Impl>(std::move(options), &service, nullptr, tokenizer, chat_template)) {}

HttpServer::HttpServer(ServerOptions options, RequestHandler& handler, const Tokenizer& tokenizer,
                       const ChatTemplate& chat_template)
    : impl_(std::make_unique<Impl>(std::move(options), nullptr, &handler, tokenizer, chat_template)) {}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start() {
  std::lock_guard lock(impl_->state_mutex);
  if (impl_->started) throw std::logic_error("HttpServer::start called twice");
  const ServerOptions& options = impl_->server.options;
  if (options.threads < 1) throw std::invalid_argument("ServerOptions.threads must be at least 1");
  impl_->io_context = std::make_unique<net::io_context>(options.threads);
  net::io_context& io_context = *impl_->io_context;
  std::string where = options.host + ":" + std::to_string(options.port);
  try {
    tcp::resolver resolver(io_context);
    tcp::endpoint endpoint = *resolver.resolve(options.host, std::to_string(options.port)).begin();
    tcp::acceptor& acceptor = impl_->acceptor.emplace(io_context);
    acceptor.open(endpoint.protocol());
    acceptor.set_option(net::socket_base::reuse_address(true));
    acceptor.bind(endpoint);
    acceptor.listen(net::socket_base::max_listen_connections);
    impl_->bound_port = acceptor.local_endpoint().port();
  } catch (const boost::system::system_error& e) {
    impl_->acceptor.reset();
    impl_->io_context.reset();
    throw std::runtime_error("cannot listen on " + where + ": " + e.code().message());
  }
  impl_->started = true;
  net::co_spawn(io_context, listen(*impl_->acceptor, impl_->server), net::detached);
  for (int i = 0; i < options.threads; ++i) {
    impl_->threads.emplace_back([&io_context] {
      for (;;) {
        try {
          io_context.run();
          return;
        } catch (const std::exception& e) {  // a handler threw past its own guards: log and keep serving
          std::fprintf(stderr, "strata http: %s\n", e.what());
        }
      }
    });
  }
}

uint16_t HttpServer::port() const { return impl_->bound_port; }

void HttpServer::start_draining() { impl_->server.draining = true; }

int HttpServer::n_in_flight() const { return impl_->server.sinks.size(); }

void HttpServer::stop() {
  std::lock_guard lock(impl_->state_mutex);
  if (!impl_->io_context) return;
  impl_->io_context->stop();
  for (std::thread& thread : impl_->threads) thread.join();
  impl_->threads.clear();
  // No session runs now. Silence the sinks the engine may still hold, then destroy the sessions with the
  // io_context: their sockets close and their requests are cancelled.
  impl_->server.sinks.cancel_all();
  impl_->acceptor.reset();
  impl_->io_context.reset();
}

}  // namespace strata
